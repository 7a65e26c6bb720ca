#!/usr/bin/env bash
# Installs the Debian packages petrel's build and tests need, only when missing.
set -e
need=()
for p in build-essential pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev \
         clang libclang-rt-14-dev curl nodejs npm python3 bible-kjv bible-kjv-text; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
# nodejs/npm may come from elsewhere (e.g. a preinstalled node); accept a working binary.
filtered=()
for p in "${need[@]}"; do
  case "$p" in
    nodejs) command -v node >/dev/null 2>&1 && continue ;;
    npm) command -v npm >/dev/null 2>&1 && continue ;;
    python3) command -v python3 >/dev/null 2>&1 && continue ;;
  esac
  filtered+=("$p")
done
if [ ${#filtered[@]} -gt 0 ]; then
  echo "petrel: installing Debian packages: ${filtered[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${filtered[@]}" >/dev/null
fi
