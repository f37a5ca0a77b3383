#!/usr/bin/env python3
"""Checks the machine code (SASS) of the built CUDA library, where CI has no GPU to run it:

  - every configured architecture has its code in the library;
  - in the sm_90a code, each kernel written for warpgroup MMA issues HGMMA (wgmma) in every one
    of its instances, and none of them touches local memory (STL/LDL: spilled registers, which
    would cost these kernels their speed without failing a test);
  - in the code of every architecture, each mma.sync kernel issues HMMA.

A kernel compiled without the sm_90a feature macros (for sm_90 instead of sm_90a, say) builds,
links and runs its fallback path, so only its instructions show that the fast path is there.

  check_sass.py --cuobjdump PATH --archs "90a;80" LIBRARY
  check_sass.py --self-test    (the check against made-up listings)

Exits 77 (skipped) when PATH is not a program: tests/cuda/CMakeLists.txt passes what
scripts/fetch_sass_tools.sh provides."""
import argparse
import os
import re
import subprocess
import sys

# Kernels built on wgmma; the sm_90a code of each must issue HGMMA and use no local memory.
WGMMA_KERNELS = ("attn_dense_sm90_kernel", "attn_fwd_sm90_ring_kernel",
                 "attn_fwd_sm90_ring_d64_kernel", "attn_sparse_sm90_kernel",
                 "tri_chunk_sm90_kernel", "vs_scores_wg_kernel", "bs_score_wg_kernel")
# Kernels built on mma.sync, for every architecture.
MMA_SYNC_KERNELS = ("attn_fwd_kernel", "attn_fwd_d64_kernel", "attn_tri_split_kernel",
                    "vs_scores_kernel", "bs_score_kernel", "bs_bound_kernel", "bs_stream_kernel",
                    "xa_mass_kernel", "rm_mma_kernel")


def functions(sass):
    """(architecture, mangled name, body) of every function in cuobjdump -sass output."""
    out, arch, name, body = [], None, None, []
    for line in sass.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        f = re.match(r"\s*Function : (\S+)", line)
        if m or f:
            if name:
                out.append((arch, name, "\n".join(body)))
            name, body = None, []
            if m:
                arch = m.group(1)
            else:
                name = f.group(1)
        elif name:
            body.append(line)
    if name:
        out.append((arch, name, "\n".join(body)))
    return out


def is_kernel(mangled, kernel):
    """Whether mangled names kernel (Itanium mangling: the identifier after its length)."""
    return re.search(rf"(?<!\d){len(kernel)}{kernel}(?:I|E|v)", mangled) is not None


def count(body, opcode):
    return len(re.findall(rf"\b{opcode}(?:\.|\s)", body))


def check(funcs, archs, log=print):
    """The failures of funcs (from functions()) against the rules above, for archs (sm_...)."""
    failures = []
    for arch in archs:
        mine = [f for f in funcs if f[0] == arch]
        if not mine:
            failures.append(f"{arch}: no code in the library")
            continue
        checks = [(k, "HMMA", False) for k in MMA_SYNC_KERNELS]
        if arch == "sm_90a":
            checks += [(k, "HGMMA", True) for k in WGMMA_KERNELS]
        for kernel, opcode, no_local in checks:
            instances = [f for f in mine if is_kernel(f[1], kernel)]
            if not instances:
                failures.append(f"{arch} {kernel}: not in the library")
            without = 0
            for _, name, body in instances:
                if count(body, opcode) == 0:
                    without += 1
                    failures.append(f"{arch} {name}: no {opcode}")
                local = count(body, "STL") + count(body, "LDL") if no_local else 0
                if local:
                    failures.append(f"{arch} {name}: {local} local-memory instructions")
            log(f"{arch} {kernel}: {len(instances)} instances, {without} without {opcode}")
    return failures


def self_test():
    """The check against made-up listings: it must pass a good one and catch each fault."""
    def listing(arch, drop=None, add=""):
        text = f"\tcode for {arch}\n"
        kernels = [(k, "HMMA.16816.F32.BF16 R0, R1, R2, R0 ;") for k in MMA_SYNC_KERNELS]
        if arch == "sm_90a":
            kernels += [(k, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;")
                        for k in WGMMA_KERNELS]
        for k, op in kernels:
            body = op if k != drop else "FFMA R0, R1, R2, R3 ;"
            text += f"\t\tFunction : _ZN7mi_cuda{len(k)}{k}I6__halfEEvv\n  {body}\n"
            if k == add:
                text += "  STL [R1], R0 ;\n"
        return text

    quiet = lambda *_: None  # noqa: E731
    both = ["sm_90a", "sm_80"]
    good = functions(listing("sm_90a") + listing("sm_80"))
    cases = [
        ("a good listing", good, both, 0),
        ("a missing architecture", functions(listing("sm_90a")), both, 1),
        ("a wgmma kernel without HGMMA",
         functions(listing("sm_90a", drop="attn_sparse_sm90_kernel")), ["sm_90a"], 1),
        ("an mma.sync kernel without HMMA",
         functions(listing("sm_80", drop="attn_fwd_kernel")), ["sm_80"], 1),
        ("a wgmma kernel spilling", functions(listing("sm_90a", add="attn_dense_sm90_kernel")),
         ["sm_90a"], 1),
        ("an mma.sync kernel spilling (allowed)",
         functions(listing("sm_80", add="attn_fwd_d64_kernel")), ["sm_80"], 0),
    ]
    # a name that merely contains a kernel's name is another kernel
    other = functions("\tcode for sm_80\n\t\tFunction : _ZN7mi_cuda19attn_fwd_kernel_oldEv\n")
    bad = 0
    for what, funcs, archs, expected in cases:
        got = len(check(funcs, archs, quiet))
        ok = got == expected
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}: {what}: {got} failures, expected {expected}")
    ok = not is_kernel(other[0][1], "attn_fwd_kernel") and is_kernel(
        good[0][1], MMA_SYNC_KERNELS[0])
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'}: kernels are told apart by their whole names")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuobjdump")
    ap.add_argument("--archs", help="the build's MI_CUDA_ARCHS, e.g. 90a;80")
    ap.add_argument("--self-test", action="store_true",
                    help="check the check against made-up listings (no library needed)")
    ap.add_argument("library", nargs="?")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not (args.cuobjdump and args.archs and args.library):
        ap.error("--cuobjdump, --archs and LIBRARY are needed")
    if not (os.path.isfile(args.cuobjdump) and os.access(args.cuobjdump, os.X_OK)):
        print(f"check_sass: no cuobjdump ({args.cuobjdump!r}); run scripts/fetch_sass_tools.sh "
              "and configure again. Skipped.")
        return 77
    run = subprocess.run([args.cuobjdump, "-sass", args.library], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"check_sass: cuobjdump failed: {run.stderr.strip()}")
        return 1
    archs = [f"sm_{a}" for a in args.archs.replace(",", ";").split(";") if a]
    failures = check(functions(run.stdout), archs)
    for f in failures:
        print("FAIL", f)
    print(f"check_sass: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
