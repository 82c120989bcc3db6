__version__ = "0.3.0"
"""The installed llmbatch version (PEP 440); the build reads it from here too."""
