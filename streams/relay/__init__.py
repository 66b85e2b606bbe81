"""The relay: change-feed rows to the websocket consumers, at least once and in order.

- Fast path (`fast_path`): right after a posting commits, the committing process hands it to its
  publisher (a daemon thread, `Publisher`), which sends the rows to the account's group (and to its
  master's, when the master is whitelisted) in batches and then marks them published. Only where
  the channel layer is shared (Redis) or in the server process itself.
- Sweeper (`sweeper`): an asyncio task in each server process publishes rows still unpublished
  after STREAM_SWEEP_GRACE_SECONDS (a process that crashed between commit and publish, or another
  process in the embedded default).
- The change feed (`feed`): the messages both send, the rows a server's hub fills a gap with, the
  rows nobody published, and the marks.
- Order: every row carries its per-account sequence; each server process's hub (streams/hub/)
  drops what it has already dispatched, holds rows that arrive ahead of a missing one for
  STREAM_GAP_WAIT_SECONDS (another process's publisher may be sending it) and reads from the
  database only what has not come by then, so duplicates and reordering between batches, between
  publishers and between the two paths never reach a client.
"""

from streams.relay.fast_path import Publisher, drain, fast_path_enabled, mark_server_process, publish_posting
from streams.relay.feed import (
    AUDIENCE_TTL_SECONDS,
    account_group,
    current_seqs,
    mark_postings_published,
    mark_published,
    messages_for,
    rows_between,
    unpublished,
)
from streams.relay.sweeper import ensure_relay, sweep_once

__all__ = [
    "AUDIENCE_TTL_SECONDS",
    "Publisher",
    "account_group",
    "current_seqs",
    "drain",
    "ensure_relay",
    "fast_path_enabled",
    "mark_postings_published",
    "mark_published",
    "mark_server_process",
    "messages_for",
    "publish_posting",
    "rows_between",
    "sweep_once",
    "unpublished",
]
