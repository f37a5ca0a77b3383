#!/usr/bin/env bash
# Checks every tracked C/CUDA source (*.c, *.h, *.cu, *.cuh) against .clang-format with a pinned
# clang-format (the PyPI wheel, installed once into .tools/clang-format/). Generated files are
# listed in .clang-format-ignore.
#   scripts/check_format.sh          lists the files that differ; exit 1 if any
#   scripts/check_format.sh --fix    reformats them in place
#   scripts/check_format.sh FILE...  only these files
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=19.1.7
VENV=.tools/clang-format
fix=0
files=()
for a in "$@"; do
    case "$a" in
    --fix) fix=1 ;;
    -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
    *) files+=("$a") ;;
    esac
done

cf="$VENV/bin/clang-format"
if ! [ -x "$cf" ] || [ "$("$cf" --version | grep -o '[0-9][0-9.]*' | head -1)" != "$VERSION" ]; then
    echo "check_format: installing clang-format $VERSION into $VENV" >&2
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then # Debian: venv is a package of its own
        rm -rf "$VENV"
        SUDO=""
        if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
        $SUDO apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/pip" install -q --disable-pip-version-check "clang-format==$VERSION"
fi

if [ ${#files[@]} -eq 0 ]; then
    ignored=$(grep -v '^\s*\(#\|$\)' .clang-format-ignore 2>/dev/null || true)
    while IFS= read -r f; do
        skip=0
        while IFS= read -r pat; do
            # shellcheck disable=SC2053 # glob patterns, as clang-format reads them
            [ -n "$pat" ] && [[ "$f" == $pat ]] && skip=1
        done <<<"$ignored"
        [ "$skip" -eq 0 ] && files+=("$f")
    done < <(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh')
fi

if [ "$fix" -eq 1 ]; then
    printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "$(nproc)" "$cf" -i --style=file
    echo "check_format: formatted ${#files[@]} files with clang-format $VERSION" >&2
    exit 0
fi

# One clang-format per file, in parallel; each prints its name (one short write) if it differs.
differ=$(printf '%s\0' "${files[@]}" | xargs -0 -P "$(nproc)" -I{} sh -c \
    '"$0" --dry-run -Werror --ferror-limit=1 --style=file "$1" >/dev/null 2>&1 || echo "$1"' \
    "$cf" {} | sort)
if [ -n "$differ" ]; then
    n=$(wc -l <<<"$differ")
    echo "check_format: $n of ${#files[@]} files differ from .clang-format (clang-format $VERSION):"
    sed 's/^/  /' <<<"$differ"
    echo "check_format: run scripts/check_format.sh --fix to reformat them"
    exit 1
fi
echo "check_format: ${#files[@]} files match .clang-format (clang-format $VERSION)"
