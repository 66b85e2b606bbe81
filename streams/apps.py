from django.apps import AppConfig


class StreamsConfig(AppConfig):
    name = "streams"
    verbose_name = "User data streams"

    def ready(self) -> None:
        from accounts.ledger.posting import after_commit_listeners
        from streams.relay import publish_posting

        # The ledger tells its listeners after commit; streams listens (the ledger never imports streams).
        if publish_posting not in after_commit_listeners:
            after_commit_listeners.append(publish_posting)
