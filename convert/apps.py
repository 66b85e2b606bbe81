from django.apps import AppConfig


class ConvertConfig(AppConfig):
    name = "convert"

    def ready(self) -> None:
        from convert import controls

        controls.register()  # which staff changes wait for a second Administrator (exchange/backoffice/changes.py)
