from cuvil.compiler.printable import printable


def test_control_format_and_line_characters_are_shown_escaped():
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("\x9b2J\x07") == "\\x9b2J\\x07"  # 8-bit CSI and BEL
    assert printable("x\u202ey\nz\r") == "x\\u202ey\\nz\\r"  # bidi override, line breaks


def test_ordinary_text_passes_unchanged():
    text = "sim-001-rpi5 ε 0.77 µs 'quoted' \"double\" é 日本"
    assert printable(text) == text
    assert printable(12) == "12"
