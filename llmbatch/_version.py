__version__ = "0.1.0"
"""The installed llmbatch version (PEP 440)."""
