#!/usr/bin/env python3
"""Where a kernel's time goes, by stretch of SASS, from an Nsight Compute source page:

  ncu -k regex:KERNEL --launch-count 1 --section SourceCounters -o rep python3 ...
  ncu --import rep.ncu-rep --page source --csv --print-source sass > kernel-sass.csv
  bench/ncu_sass_regions.py kernel-sass.csv [--width 50] [--min 1.0]

Prints, for each stretch of --width instructions in address order that holds at least --min %
of the warp stall samples or of the executed warp instructions, both shares and its most executed
opcodes (with their share of all executed instructions): enough to tell which loop of a kernel
issues and stalls most, without a GUI. Print a stretch with `--show START` to read its SASS."""
import argparse
import collections
import csv


def opcode(sass):
    words = sass.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--width", type=int, default=50, help="instructions a stretch")
    ap.add_argument("--min", type=float, default=1.0, help="smallest share shown, in %%")
    ap.add_argument("--show", type=int, help="print the SASS of the stretch starting here")
    args = ap.parse_args()
    if args.width < 1:
        ap.error("--width must be at least 1")
    try:
        with open(args.csv, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        ap.error(f"{args.csv}: {e.strerror}")
    try:
        header = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    except StopIteration:
        ap.error(f"{args.csv}: no SASS source table (Address, Source columns) found")
    names = rows[header]
    data = [r for r in rows[header + 1:] if len(r) == len(names)]
    i_src = names.index("Source")
    i_smp = names.index("Warp Stall Sampling (All Samples)")
    i_exe = names.index("Instructions Executed")
    num = lambda r, i: int(r[i] or 0)  # noqa: E731
    samples = sum(num(r, i_smp) for r in data) or 1
    executed = sum(num(r, i_exe) for r in data) or 1
    print(f"{len(data)} instructions, {samples} stall samples, {executed} warp instructions")
    if args.show is not None:
        for n, r in enumerate(data[args.show:args.show + args.width], args.show):
            print(f"{n:6d} {num(r, i_exe):10d} {num(r, i_smp):6d}  {r[i_src].strip()}")
        return
    for start in range(0, len(data), args.width):
        part = data[start:start + args.width]
        s = 100 * sum(num(r, i_smp) for r in part) / samples
        e = 100 * sum(num(r, i_exe) for r in part) / executed
        if s < args.min and e < args.min:
            continue
        ops = collections.Counter()
        for r in part:
            ops[opcode(r[i_src])] += num(r, i_exe)
        top = " ".join(f"{o}:{100 * c / executed:.1f}" for o, c in ops.most_common(6))
        print(f"{start:6d}  samples {s:5.1f}%  instructions {e:5.1f}%  {top}")


if __name__ == "__main__":
    main()
