"""The code that runs the stack, installed as an app (label "stack", no models) only so that its
command (`manage.py simulate`, in harness/management/) is found."""

from django.apps import AppConfig


class StackConfig(AppConfig):
    name = "harness"
    label = "stack"
    verbose_name = "Stack"
