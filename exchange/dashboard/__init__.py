"""The operations back office: the dashboard and the customer page (docs/operations.md, "Dashboard and
customer page"). Read-only pages inside the Django admin; they change nothing (actions stay in the
model admins, which call the services)."""
