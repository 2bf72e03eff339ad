import pytest

from power.orchestrator.inputs.units import SizeError, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24 GiB", 24 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5 GB", 1_500_000_000),
        ("1.5 KiB", 1536),
        ("250 kB", 250_000),
        ("141 GB", 141_000_000_000),
        ("2 TiB", 2 * 1024**4),
        ("17 B", 17),
        ("17", 17),
        ("1_140_000_000", 1_140_000_000),
        ("  8 GiB ", 8 * 1024**3),
        ("8 giB", 8 * 1024**3),
        (22_884_408_288, 22_884_408_288),
        (0, 0),
        (4096.0, 4096),
        ("1024 TiB", 2**50),
    ],
)
def test_accepted_forms(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("24 Gb", "bits"),
        ("24 GiBs", "unknown size unit"),
        ("24 XB", "unknown size unit"),
        ("lots", "cannot read"),
        ("", "cannot read"),
        ("1.2 ", "not a whole number of bytes"),
        ("-3 GiB", "cannot read"),
        (-3, "negative"),
        (1.5, "whole number"),
        (True, "boolean"),
        ([24], "integer or a string"),
        ("1025 TiB", "larger than 1.00 PiB"),
        (2**50 + 1, "larger than 1.00 PiB"),
        (10**41, "larger than 1.00 PiB"),
        (1e300, "larger than 1.00 PiB"),
        ("9" * 5000, "larger than 1.00 PiB"),
        ("1." + "0" * 5000, "more decimal places"),
        (float("nan"), "whole number"),
        (float("inf"), "whole number"),
    ],
)
def test_rejected_forms_say_why_and_list_the_accepted_ones(value, fragment):
    with pytest.raises(SizeError) as caught:
        parse_size(value)
    assert fragment in str(caught.value)
    assert "GiB" in caught.value.hint and "integer" in caught.value.hint


def test_format_size_uses_binary_units():
    assert format_size(24 * 1024**3) == "24.00 GiB"
    assert format_size(512 * 1024**2) == "512.00 MiB"
    assert format_size(17) == "17 B"
