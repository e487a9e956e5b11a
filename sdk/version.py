"""The package version, in a module of its own: the API stamps it into bundles and the package re-exports it."""

__version__ = "0.1.0"
