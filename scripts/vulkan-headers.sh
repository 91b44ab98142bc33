#!/usr/bin/env bash
# Prints an include folder with Vulkan headers new enough for the pinned ggml-vulkan (it uses
# VK_EXT_layer_settings: vk::LayerSettingsCreateInfoEXT). The system's when they have it; otherwise
# Debian 13's libvulkan-dev headers, fetched with a private apt state under build/apt-vulkan (the
# machine's own Debian source, suite trixie; nothing is installed and the system's apt is untouched)
# and unpacked into build/vulkan-headers. Debian 12 ships 1.3.239, which lacks the extension.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
has_layer_settings() { grep -qs "struct LayerSettingsCreateInfoEXT" "$1/vulkan/vulkan_structs.hpp"; }

if has_layer_settings /usr/include; then echo /usr/include; exit 0; fi
out=$root/build/vulkan-headers
if has_layer_settings "$out/usr/include"; then echo "$out/usr/include"; exit 0; fi

state=$root/build/apt-vulkan
rm -rf "$state"
mkdir -p "$state/sources.list.d" "$state/lists/partial" "$state/cache/archives/partial"
: > "$state/sources.list"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    # the first stanza of the system's Debian source (deb822), for suite trixie
    awk 'BEGIN { RS = ""; ORS = "\n\n" } NR == 1' /etc/apt/sources.list.d/debian.sources \
        | sed 's/^Suites:.*/Suites: trixie/' > "$state/sources.list.d/trixie.sources"
else
    grep -hE '^deb [^ ]+ [a-z]+ main' /etc/apt/sources.list 2>/dev/null | head -n 1 \
        | awk '{ print $1, $2, "trixie", "main" }' > "$state/sources.list"
fi
apt_opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=$state/sources.list.d"
          -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o "Debug::NoLocking=1")
echo "farctx: fetching Debian 13's Vulkan headers (libvulkan-dev) into build/vulkan-headers" >&2
apt-get -qq "${apt_opts[@]}" update >&2
(cd "$state" && apt-get -qq "${apt_opts[@]}" download libvulkan-dev >&2 2>/dev/null)
rm -rf "$out"
mkdir -p "$out"
dpkg -x "$state"/libvulkan-dev_*.deb "$out"
has_layer_settings "$out/usr/include" || { echo "farctx: the fetched headers lack VK_EXT_layer_settings" >&2; exit 1; }
echo "$out/usr/include"
