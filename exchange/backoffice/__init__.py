"""The back office's staff tools, a Django app (label "backoffice"): the audit trail, four-eyes changes
of settings that matter to money, the staff roles, the admin's safety and building blocks. Every
app's admin and controls use it; it uses only the gateway and the runtime helpers."""
