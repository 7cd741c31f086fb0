"""`CairnSaver`: a LangGraph checkpointer on Cairn's storage.

Installed with `pip install 'cairn-agents[langgraph]'`.

It runs on plain Redis 7 (no modules) with a disk archive behind it, and closes the gaps
LangGraph's own savers leave:

- **Fenced writes.** A put must extend the head of its thread's namespace: two writers
  racing on one thread get `FencedWrite` instead of two silent branches
  (langchain-ai/langgraph#8796). Time travel still forks: a writer that read a checkpoint
  by its id may put a child of it, and the fork becomes the head. A put naming no parent
  starts a new history beside the old one, as LangGraph's conformance suite expects;
  `strict=True` refuses that too (two runs starting one new thread at once).
- **Cost that depends on what changed.** A list channel that only grew since the version
  this saver last wrote or read (`add_messages` histories) is stored as pieces: each
  version's blob holds its new items and folds in the newest pieces no bigger than it
  (a binary counter), so a read joins O(log n) blobs and a step with 1,000 messages of
  history stores about what it added, not the 1,000 messages.
- **Checksums.** Every record is sealed by Cairn's codec (SHA-256, HMAC-SHA256 with
  `CAIRN_SIGNING_KEY`, zstd above a size); a damaged one is refused with its name.
- **Retention and a cold tier.** `archive(thread_id, keep=N)` moves all but the newest N
  checkpoints of each namespace (their writes and the blobs only they use) to the disk
  archive; with `hot_keep=N` the saver does it itself once a namespace holds 2N in Redis.
  Every read falls back to the archive.

Keys live under `cairn:lg:{<thread>}:` (storage/keys.py), one hash slot per thread.
Values are serialized with LangGraph's serializer (`JsonPlusSerializer`, no pickle).
Channel versions are LangGraph's integers; a blob's key names the put that wrote it, so
two branches of a thread (a replay, an `update_state` fork) never share one.

The modules: `saver` (the checkpointer: puts, fencing, forks, reads), `threaded` (its
async methods, each its sync twin on a thread), `pieces` (the stored form of a list that
only grew), `tiers` (reads from Redis, else the archive), `cold` (moving checkpoints to
the archive) and `places` (each record's sealed place and archive name).
"""

from cairn.storage.langgraph.saver import CairnSaver

__all__ = ["CairnSaver"]
