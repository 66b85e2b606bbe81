"""The Celery app. Tasks are thin: they load by id and call a service (docs/architecture.md section 4)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")

app = Celery("exchange")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
