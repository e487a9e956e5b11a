"""Op family: shape (see docs/ir.md)."""
