"""Tables at the width of a log: names whole, numbers on one line, long words under the table."""

from rich.console import Console

from fi_profile.readable_table import Notes, print_table

LONG = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e256_h7168_i2048"
WHY = "the engine's kernel (vllm) was not run: the engines' natives run on CUDA only"


def printed(width: int, names: list[str]) -> list[str]:
    console = Console(record=True, width=width)
    notes = Notes()
    rows = [[name, "1,234", "0.1234", "12.345", f"none {notes.mark(WHY)}", "1.23"] for name in names]
    print_table(console, "title", ["kernel", "calls", "ms", "total ms", "baseline", "× base"], rows,
                left=("baseline",), notes=notes)
    return console.export_text().splitlines()


def test_names_that_fit_stay_in_their_rows():
    lines = printed(120, [LONG, "rmsnorm_h7168"])
    assert any(line.startswith(f"│ {LONG} │") for line in lines), lines
    assert sum(WHY in line for line in lines) == 1 and lines[-1] == f"  (1) {WHY}"  # one note for two rows


def test_names_too_long_for_the_width_are_keyed_and_listed_whole():
    lines = printed(80, [LONG, "rmsnorm_h7168"])
    table = [line for line in lines if line.startswith(("│", "┃", "┏", "└"))]
    assert all(len(line) <= 80 for line in lines if WHY not in line), lines
    assert any(line.startswith("│ [1] ") and "1,234" in line and "12.345" in line for line in table), lines
    assert f"  [1] {LONG}" in lines and not any(LONG in line for line in table)  # never cut in a cell
    assert any(line.startswith("│ rmsnorm_h7168 ") for line in table)  # a name that fits stays in its row


def test_an_empty_table_prints_its_headers():
    assert any("kernel" in line for line in printed(80, []))


def test_columns_too_many_for_the_width_go_on_to_a_second_table_every_number_whole():
    """The projection table of an 8B model at 80 columns: eight columns, numbers of up to 8 digits."""
    console = Console(record=True, width=80)
    headers = ["kernel", "calls", "measured", "projected", "ratio", "SM MHz eng/replay", "engine's kernel", "best saves"]
    rows = [[f"gemm_bf16_n{n}_k4096", "16896", "1226.123", "1153.851", "0.94 !", "1,784/1,979", "sglang, sglang_triton",
             "213.514"] for n in (28672, 6144, 4096)]
    print_table(console, "projection", headers, rows, left=("engine's kernel",))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines) and not any("…" in line for line in lines), lines
    assert sum(line.startswith("┃ ") for line in lines) == 2  # two tables' header rows
    assert any(line.rstrip() == "(continued)" for line in lines)
    for cell in rows[0][1:]:
        assert sum(cell in line for line in lines) == 3, cell  # every cell whole, once per row
    headers_seen = " ".join(line for line in lines if line.startswith("┃ "))
    assert all(header in headers_seen for header in headers[1:])
