"""The project package installed as an app (label "project", no models) only so that the commands in
exchange/management/ (the stack's: `manage.py simulate`) are found."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "exchange"
    label = "project"
    verbose_name = "Project"
