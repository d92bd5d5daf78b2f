#!/usr/bin/env bash
# scripts/device-pack.sh — for developers lent a GPU machine (the
# workplace's device tool): packs what scripts/device-check.sh needs there,
# so that the device time goes into running, not building.
#
# Writes .dev/ in the repository root (ignored by git through
# .git/info/exclude, which this script extends):
#   .dev/build.tar.xz   build/bin, build/tests/mgtest and build/bench's
#                       programs, as built here (make tools tests benches with
#                       the CUDA toolkit found, so that they hold the GPU
#                       kernels and the NCCL path);
#   .dev/libs.tar.xz    every shared library they load that is not glibc's
#                       or the C++ runtime's (OpenBLAS and gfortran, Open
#                       MPI, OpenSSL's libcrypto, zlib, CUDA's runtime ...):
#                       the machine's image is not Debian and lacks them;
#   .dev/fortunes.tar.xz  the text corpus gpt-mini trains on.
# Then: run with carry [".dev"] and command
#   bash scripts/device-check.sh [tests] [bench sections] [nccl sections]
# Limits: the machine must run x86-64 Linux with a glibc at least this
# one's; the whole tree sent must stay under 64 MiB (this is about 25).
set -euo pipefail
cd "$(dirname "$0")/.."
make -j"$(nproc)" tools tests benches >/dev/null
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
rm -rf .dev && mkdir -p .dev/libs
progs="build/bin/* build/tests/mgtest $(find build/bench -maxdepth 1 -type f -perm -u+x)"
tar -cJf .dev/build.tar.xz $progs
# The libraries the programs load (dlopen'd NCCL excepted: the machine has
# its own, matching its driver).
for p in $progs; do ldd "$p" 2>/dev/null; done | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libmvec|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    while read -r lib; do cp -L "$lib" .dev/libs/; done
tar -cJf .dev/libs.tar.xz -C .dev libs && rm -rf .dev/libs
tar -cJf .dev/fortunes.tar.xz -C /usr/share/games fortunes
du -sh .dev/*
