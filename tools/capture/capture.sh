#!/bin/bash
# Record ground truth from a machine with a real NVIDIA GPU into DIR (default $OUT/capture).
# Everything is best effort: a failing command records its exit status and goes on.
D=${1:-${OUT:-/tmp}/capture}
mkdir -p "$D"
run() { # run NAME CMD...
  local name=$1; shift
  { "$@"; echo "# exit=$?"; } >"$D/$name.txt" 2>&1
}
SMI=$(command -v nvidia-smi)
echo "nvidia-smi at $SMI" >"$D/env.txt"
{ uname -a; cat /etc/os-release; env | grep -i -E 'nvidia|cuda|ld_'; ls -la /usr/local/nvidia /usr/local/nvidia/* 2>&1 | head -80; } >>"$D/env.txt" 2>&1
run smi-plain nvidia-smi
run smi-L nvidia-smi -L
run smi-q nvidia-smi -q
run smi-version nvidia-smi --version
timeout 60 nvidia-smi -q -x >"$D/qx-h200.xml" 2>"$D/qx-h200.err"; echo "exit=$?" >>"$D/qx-h200.err"
for d in SUPPORTED_CLOCKS CLOCK POWER TEMPERATURE PERFORMANCE ECC PAGE_RETIREMENT ROW_REMAPPER MEMORY PCIE; do
  run "smi-q-d-$d" nvidia-smi -q -d "$d"
done
run smi-topo nvidia-smi topo -m
run smi-nvlink-s nvidia-smi nvlink -s
run smi-nvlink-c nvidia-smi nvlink -c
run smi-nvlink-status nvidia-smi nvlink --status
run smi-mig-lgi nvidia-smi mig -lgi
run smi-dmon timeout 20 nvidia-smi dmon -c 1
run smi-pmon timeout 20 nvidia-smi pmon -c 1
run smi-apps nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
run smi-help-query-gpu nvidia-smi --help-query-gpu
FIELDS=$(nvidia-smi --help-query-gpu | grep -o '^"[^"]*"' | tr -d '"' | sort -u)
: >"$D/smi-query-fields.csv"
for f in $FIELDS; do
  printf '%s,%s\n' "$f" "$(nvidia-smi --query-gpu="$f" --format=csv,noheader 2>&1 | head -1)" >>"$D/smi-query-fields.csv"
done
run smi-query-wide nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,memory.free,power.draw,power.limit,enforced.power.limit,temperature.gpu,clocks.sm,clocks.max.sm,clocks.mem,pstate,ecc.mode.current,compute_mode,mig.mode.current,vbios_version --format=csv
{ cat /proc/driver/nvidia/version; ls -laR /proc/driver/nvidia; for f in /proc/driver/nvidia/params /proc/driver/nvidia/registry /proc/driver/nvidia/gpus/*/*; do echo "== $f"; cat "$f"; done; } >"$D/proc-driver-nvidia.txt" 2>&1
{ ls -la /dev/nvidia* /dev/nvidia-caps 2>&1; cat /proc/devices; grep -i nvidia /proc/modules; cat /sys/module/nvidia/version; ls /sys/module/nvidia 2>&1; } >"$D/dev-and-modules.txt" 2>&1
{ for p in /sys/bus/pci/devices/*; do
    [ "$(cat "$p/vendor" 2>/dev/null)" = 0x10de ] || continue
    echo "=== $p -> $(readlink -f "$p")"
    ls -la "$p/"
    for f in vendor device class revision subsystem_vendor subsystem_device numa_node local_cpulist local_cpus resource irq current_link_speed current_link_width max_link_speed max_link_width enable driver_override; do
      echo "-- $f: $(cat "$p/$f" 2>&1)"; done
    echo "-- driver: $(readlink "$p/driver")"
    echo "-- config:"; od -A x -t x1 -v "$p/config" 2>&1 | head -70
  done; lspci -nnvv 2>&1 | head -200; } >"$D/sysfs-pci.txt" 2>&1
LIB=$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')
[ -n "$LIB" ] || LIB=$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null | head -1)
echo "lib=$LIB real=$(readlink -f "$LIB")" >>"$D/env.txt"
python3 tools/capture/nvml_dump.py >"$D/nvml-dump.json" 2>"$D/nvml-dump.err"; echo "exit=$?" >>"$D/nvml-dump.err"
python3 - "$LIB" >"$D/nvml-symbols.txt" 2>&1 <<'PY'
import ctypes, sys
# List dynamic symbols of the real library by reading its ELF .dynsym (no binutils there).
import struct
data = open(sys.argv[1], 'rb').read()
shoff, = struct.unpack_from('<Q', data, 0x28); shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3a)
secs = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
for s in secs:
    if s[1] == 11:  # SHT_DYNSYM
        strtab = secs[s[6]]
        for off in range(s[4], s[4] + s[5], 24):
            name, info, other, shndx, value, size = struct.unpack_from('<IBBHQQ', data, off)
            if shndx == 0: continue
            end = data.index(b'\0', strtab[4] + name)
            print(data[strtab[4] + name:end].decode())
PY
# The export table nvidia-smi uses: its size slot and a few leading bytes (facts, no code).
python3 - "$LIB" >"$D/export-table.txt" 2>&1 <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); print('init', lib.nvmlInitWithFlags(0))
tab = ctypes.c_void_p()
uid = (ctypes.c_uint8 * 16)(*bytes.fromhex('c4fe3e6cc98f6c4ea327ee696e12f7c4'))
print('ret', lib.nvmlInternalGetExportTable(ctypes.byref(tab), uid))
if tab.value: print('size', hex(ctypes.c_uint64.from_address(tab.value).value))
PY
ls -la "$D"
