"""Built-in length distributions and the lengths-file reader."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.scheduler import generate_lengths, parse_lengths, read_lengths
from costmodel.scheduler.lengths import DEFAULT_MAX_RESPONSE


def test_rl_distribution_shape_and_seed():
    a = generate_lengths(20000, "rl", seed=1)
    assert np.array_equal(a, generate_lengths(20000, "rl", seed=1))
    assert not np.array_equal(a, generate_lengths(20000, "rl", seed=2))
    assert a.dtype == np.int64 and a.min() >= 201 and a.max() <= 1500 + DEFAULT_MAX_RESPONSE
    # prompt ~U[200, 1500] (median 850) + lognormal response (median 1500).
    assert 2100 < np.median(a) < 2600
    assert np.mean(a > 8000) > 0.03, "a long tail"


def test_bimodal_distribution():
    a = generate_lengths(20000, "bimodal", seed=0)
    long_ = a > 0.75 * DEFAULT_MAX_RESPONSE
    assert 0.08 < long_.mean() < 0.12
    assert np.median(a[~long_]) < 2000


def test_unknown_distribution_and_bad_n():
    with pytest.raises(ValueError, match="unknown length distribution 'zipf'.*rl, bimodal"):
        generate_lengths(10, "zipf")
    with pytest.raises(ValueError, match="n must be"):
        generate_lengths(0)


def test_parse_lines_commas_comments():
    text = "# lengths\n100\n200, 300,\n\n  400 ,500\n"
    assert parse_lengths(text).tolist() == [100, 200, 300, 400, 500]
    # A comment after a length (a walkthrough found it refused as "'#' is not a number").
    assert parse_lengths("1200\n3400 # the long one\n500,#\n").tolist() == [1200, 3400, 500]


def test_parse_spaces_and_whole_floats():
    """Space-separated rows and "4096.0" (pandas writes whole lengths so from a float column)."""
    assert parse_lengths("512 4096 900\n4096.0\n7.\n").tolist() == [512, 4096, 900, 4096, 7]


@pytest.mark.parametrize(
    "text, match",
    [
        ("100\n200\nabc\n", "line 3: 'abc' is not a whole number"),
        ("100\n2.5\n", "line 2: '2.5'"),
        ("100,,200\n", "line 1: empty field"),
        (",100\n", "line 1: empty field"),
        ("100\n4096.5\n", "line 2: '4096.5' is not a whole number"),
        ("100\n1e3\n", "line 2: '1e3'"),
        ("100\n0\n", "line 2: length 0 must be >= 1"),
        ("100\n-4\n", "line 2: length -4 must be >= 1"),
        ("# nothing\n\n", "no lengths found"),
        # Unicode digits read as numbers, and 5,000 digits gave Python's int() limit message.
        ("100\n\u0661\u0662\n", "line 2: '\u0661\u0662' is not a whole number"),
        ("1\n" + "9" * 5000, r"line 2: length 999999999999\.\.\. \(5000 digits\) is too large"),
        ("-" + "9" * 5000, r"line 1: length -999999999999\.\.\. \(5000 digits\) is below 1"),
        ("0" * 5000, "line 1: length 0 must be >= 1"),
    ],
)
def test_parse_rejects_junk_naming_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        parse_lengths(text)


def test_read_lengths_file(tmp_path):
    p = tmp_path / "lengths.txt"
    p.write_text("10\n20\n30\n")
    assert read_lengths(p).tolist() == [10, 20, 30]
    with pytest.raises(FileNotFoundError, match="lengths file not found"):
        read_lengths(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("10\nx\n")
    with pytest.raises(ValueError, match=r"bad.txt: line 2"):
        read_lengths(bad)


def test_huge_length_is_a_clear_error():
    with pytest.raises(ValueError, match="line 2: length .* too large: beyond any context window"):
        parse_lengths("12\n99999999999999999999999\n")


def test_leading_zeros_are_no_reason_to_refuse():
    assert parse_lengths("0" * 5000 + "7\n+0012\n").tolist() == [7, 12]


def test_parse_skips_a_byte_order_mark():
    assert parse_lengths("\ufeff1000\n5\n").tolist() == [1000, 5]


def test_negative_seed_and_a_folder_as_lengths_file(tmp_path):
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        generate_lengths(10, "rl", seed=-1)
    with pytest.raises(ValueError, match="is a folder; give a lengths file"):
        read_lengths(tmp_path)


def test_read_lengths_from_json_and_npy(tmp_path):
    (tmp_path / "a.json").write_text('{"lengths": [10, 20]}')
    (tmp_path / "b.json").write_text("[3, 4, 5]")
    np.save(tmp_path / "c.npy", np.array([7, 8], dtype=np.int32))
    assert read_lengths(tmp_path / "a.json").tolist() == [10, 20]
    assert read_lengths(tmp_path / "b.json").tolist() == [3, 4, 5]
    assert read_lengths(tmp_path / "c.npy").tolist() == [7, 8]
    np.save(tmp_path / "d.npy", np.array([2**63], dtype=np.uint64))  # not read as negative
    with pytest.raises(ValueError, match="too large"):
        read_lengths(tmp_path / "d.npy")


def test_json_booleans_and_empty_files_are_refused_naming_the_file(tmp_path):
    """JSON `true` is a Python int: it would be a 1-token sample. An empty list or array
    said "0 samples cannot fill dp ..." later, without naming the file."""
    (tmp_path / "flags.json").write_text("[100, true, 200]")
    with pytest.raises(ValueError, match=r"flags\.json: the entry at index 1 is True; every length must be"):
        read_lengths(tmp_path / "flags.json")
    (tmp_path / "empty.json").write_text('{"lengths": []}')
    np.save(tmp_path / "empty.npy", np.array([], dtype=np.int64))
    for name in ("empty.json", "empty.npy"):
        with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}: no lengths found"):
            read_lengths(tmp_path / name)


def test_json_too_deep_or_too_many_digits_names_the_file(tmp_path):
    """Both escaped without the file's name: "maximum recursion depth exceeded while
    decoding a JSON array" (a RuntimeError) and "Exceeds the limit (4300 digits) ..."."""
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "digits.json").write_text("[1" + "0" * 5000 + "]")
    with pytest.raises(ValueError, match=r"deep\.json: JSON nested too deeply"):
        read_lengths(tmp_path / "deep.json")
    with pytest.raises(ValueError, match=r"digits\.json: not valid JSON \(Exceeds the limit"):
        read_lengths(tmp_path / "digits.json")


def test_a_text_file_named_npy_is_not_sent_to_pickle(tmp_path):
    """numpy calls a text file "pickled data" and suggests allow_pickle: the error says what
    the file is not, and what to give instead."""
    (tmp_path / "lengths.npy").write_text("100\n200\n")
    with pytest.raises(ValueError, match=r"lengths\.npy: not a \.npy array of lengths \(not a "
                       r"\.npy file\); save an integer array with numpy\.save, or give the lengths as a text"):
        read_lengths(tmp_path / "lengths.npy")
    np.save(tmp_path / "objects.npy", np.array([100, "x"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"not a \.npy array of lengths \(an array of Python objects\)"):
        read_lengths(tmp_path / "objects.npy")


def test_lengths_from_a_pipe(tmp_path):
    """Regression: `--lengths <(...)` and /dev/stdin were "lengths file not found"."""
    import os
    import threading

    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    fifo = tmp_path / "lengths"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("100\n200\n"))
    writer.start()
    try:
        assert read_lengths(fifo).tolist() == [100, 200]
    finally:
        writer.join(timeout=10)


def test_npy_lengths_are_one_dimensional_and_positive(tmp_path):
    np.save(tmp_path / "zero.npy", np.array([5, 0, 7]))
    with pytest.raises(ValueError, match="the entry at index 1 is 0"):
        read_lengths(tmp_path / "zero.npy")
    np.save(tmp_path / "matrix.npy", np.ones((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="1-D integer array"):
        read_lengths(tmp_path / "matrix.npy")


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_the_longest_length_allowed_is_accepted():
    """MAX_LENGTH itself is a length; one more is not."""
    from costmodel.flops import MAX_LENGTH

    assert parse_lengths(f"5\n{MAX_LENGTH}\n").tolist() == [5, MAX_LENGTH]
    with pytest.raises(ValueError, match="line 2: length .* too large"):
        parse_lengths(f"5\n{MAX_LENGTH + 1}\n")


def test_generate_refuses_an_empty_response_range_and_a_non_integer_seed():
    with pytest.raises(ValueError, match="max_response must be >= 1, got 0"):
        generate_lengths(10, "rl", max_response=0)
    for seed in (True, 1.5):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            generate_lengths(10, "rl", seed=seed)


def test_files_of_the_wrong_shape_or_encoding_are_named(tmp_path):
    """A JSON object without "lengths" says the form expected (not 'no lengths found'); a
    file that is not UTF-8, text or JSON, names the file (not only the codec's complaint);
    an out-of-range entry of a .npy is the one named."""
    (tmp_path / "other.json").write_text('{"sizes": [100]}')
    with pytest.raises(ValueError, match=r'other\.json: expected a JSON list of lengths or \{"lengths"'):
        read_lengths(tmp_path / "other.json")
    for name in ("latin1.json", "latin1.txt"):
        (tmp_path / name).write_bytes(b"[100, 2\xe900]")
        with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}: not "):
            read_lengths(tmp_path / name)
    np.save(tmp_path / "big.npy", np.array([5, 2**40], dtype=np.int64))
    with pytest.raises(ValueError, match=r"big\.npy: the entry at index 1 is 1099511627776"):
        read_lengths(tmp_path / "big.npy")


def test_an_upper_case_suffix_is_still_json_or_npy(tmp_path):
    """LENGTHS.JSON was read as text, refused as "'[100' is not a whole number of tokens"
    (an audit); a .NPY file's binary header as "not a text file of lengths"."""
    (tmp_path / "LENGTHS.JSON").write_text("[100, 200]")
    np.save(tmp_path / "lengths.npy", np.array([7, 8]))
    (tmp_path / "lengths.npy").rename(tmp_path / "LENGTHS.NPY")
    assert read_lengths(tmp_path / "LENGTHS.JSON").tolist() == [100, 200]
    assert read_lengths(tmp_path / "LENGTHS.NPY").tolist() == [7, 8]
