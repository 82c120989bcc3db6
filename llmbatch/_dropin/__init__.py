"""What the openai drop-in rides on: httpx transports that send an httpx-based
program's OpenAI requests through an llmbatch client (``transport``, and
``sync_transport`` for sync programs). Public as ``llmbatch.transports``.
"""
