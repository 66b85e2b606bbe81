from django.apps import AppConfig


class SubaccountsConfig(AppConfig):
    name = "subaccounts"

    def ready(self) -> None:
        # Loading the tasks hands the collection task to subaccounts/collection.py (set_worker).
        from subaccounts import tasks  # noqa: F401
