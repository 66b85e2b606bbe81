"""Operator scripts run from the project root (`.venv/bin/python scripts/<name>.py`); a package so that
tests and `manage.py simulate` import them as `scripts.<name>`."""
