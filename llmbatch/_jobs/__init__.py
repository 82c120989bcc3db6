"""``llmbatch run``: resumable JSONL batch jobs in the OpenAI Batch API format.

``format`` reads input lines and writes output records, ``output`` owns the output
file (lock, resume, append), ``runner`` drives a job through a client, ``cli`` is
the command line.
"""
