import math

from cuvil.coordinator import formatting as fmt


def test_durations_take_the_unit_that_fits():
    assert fmt.duration_ms(0.0012) == "1.20 µs"
    assert fmt.duration_ms(0.25) == "250 µs"
    assert fmt.duration_ms(12.34) == "12.3 ms"
    assert fmt.duration_ms(4200) == "4.20 s"
    assert fmt.duration_ms(0.0000005) == "0.50 ns"
    assert fmt.duration_ms(None) == fmt.duration_ms(math.nan) == "-"


def test_wall_clock_spans():
    assert fmt.seconds(3.21) == "3.2 s" and fmt.seconds(245) == "4 min 05 s" and fmt.seconds(7500) == "2 h 05 min"


def test_estimates_keep_their_sign_and_error():
    assert fmt.estimate(-0.0094, 0.1401) == "-0.009 ± 0.140"
    assert fmt.estimate(None, 0.1) == "-"


def test_a_repeated_code_prefix_is_said_once():
    assert fmt.reason("DP_BUDGET_EXHAUSTED: DP_BUDGET_EXHAUSTED: spent") == "DP_BUDGET_EXHAUSTED: spent"
    assert fmt.reason("SIGNATURE_REJECTED: SIGNATURE_REJECTED: SIGNATURE_REJECTED: x") == "SIGNATURE_REJECTED: x"
    assert fmt.reason("DEVICE_ERROR: DeviceError: x") == "DEVICE_ERROR: DeviceError: x"


def test_vector_isa_from_features():
    assert fmt.vector_isa("+avx,+avx2,+fma,+avx512f,-prefer-256-bit") == "AVX-512"
    assert fmt.vector_isa("+neon,+sve") == "SVE" and fmt.vector_isa("+neon,+dotprod") == "NEON"
    assert fmt.vector_isa("") == "-"


def test_a_percentile_at_the_histogram_floor_says_so():
    assert fmt.histogram_ms(0.001) == "≤ 1.00 µs"  # the first bucket also holds every faster run
    assert fmt.histogram_ms(0.0012) == "1.20 µs" and fmt.histogram_ms(None) == "-"
