"""Op family: reduce (see docs/ir.md)."""
