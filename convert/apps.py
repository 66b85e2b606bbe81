from django.apps import AppConfig


class ConvertConfig(AppConfig):
    name = "convert"
