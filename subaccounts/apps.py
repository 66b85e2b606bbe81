from django.apps import AppConfig


class SubaccountsConfig(AppConfig):
    name = "subaccounts"
