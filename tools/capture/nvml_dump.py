#!/usr/bin/env python3
"""Dump everything nvidia-ml-py can read from every GPU on this machine as JSON.

Used once on real hardware to record ground truth for a profile. Every call is
tried independently; failures are recorded as the NVML error string.
"""

from __future__ import annotations

import ctypes
import json
import sys

import pynvml as N


def plain(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        out = {}
        for field in value._fields_:
            name = field[0]
            try:
                out[name] = plain(getattr(value, name))
            except Exception as exc:
                out[name] = f"<{exc}>"
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    try:
        return plain(value.value)
    except Exception:
        return repr(value)


def attempt(func, *args):
    try:
        return {"ok": plain(func(*args))}
    except N.NVMLError as exc:
        return {"error": str(exc), "code": exc.value}
    except Exception as exc:
        return {"exception": f"{type(exc).__name__}: {exc}"}


def call(name, *args):
    func = getattr(N, name, None)
    if func is None:
        return {"missing": name}
    return attempt(func, *args)


def constants(prefix):
    return {k: getattr(N, k) for k in dir(N) if k.startswith(prefix) and isinstance(getattr(N, k), int)}


def device_dump(h):
    d = {}
    simple = [
        "nvmlDeviceGetName",
        "nvmlDeviceGetBrand",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetBoardPartNumber",
        "nvmlDeviceGetBoardId",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetPciInfoExt",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetPcieSpeed",
        "nvmlDeviceGetPcieLinkMaxSpeed",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetBAR1MemoryInfo",
        "nvmlDeviceGetMemoryBusWidth",
        "nvmlDeviceGetNumGpuCores",
        "nvmlDeviceGetIrqNum",
        "nvmlDeviceGetPowerSource",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetPowerManagementMode",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerState",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetJpgUtilization",
        "nvmlDeviceGetOfaUtilization",
        "nvmlDeviceGetEncoderStats",
        "nvmlDeviceGetEncoderSessions",
        "nvmlDeviceGetFBCStats",
        "nvmlDeviceGetFBCSessions",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetDefaultEccMode",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetMultiGpuBoard",
        "nvmlDeviceGetDisplayMode",
        "nvmlDeviceGetDisplayActive",
        "nvmlDeviceGetInforomImageVersion",
        "nvmlDeviceGetInforomConfigurationChecksum",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetNumFans",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetGpuOperationMode",
        "nvmlDeviceGetAccountingMode",
        "nvmlDeviceGetAccountingBufferSize",
        "nvmlDeviceGetAccountingPids",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRowRemapperHistogram",
        "nvmlDeviceGetGspFirmwareVersion",
        "nvmlDeviceGetGspFirmwareMode",
        "nvmlDeviceGetModuleId",
        "nvmlDeviceGetC2cModeInfoV",
        "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetPlatformInfo",
        "nvmlDeviceGetAddressingMode",
        "nvmlDeviceGetVirtualizationMode",
        "nvmlDeviceGetHostVgpuMode",
        "nvmlDeviceGetGridLicensableFeatures",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceGetSupportedMemoryClocks",
        "nvmlDeviceGetAutoBoostedClocksEnabled",
        "nvmlDeviceGetGpcClkVfOffset",
        "nvmlDeviceGetMemClkVfOffset",
        "nvmlDeviceGetGpcClkMinMaxVfOffset",
        "nvmlDeviceGetMemClkMinMaxVfOffset",
        "nvmlDeviceGetAdaptiveClockInfoStatus",
        "nvmlDeviceGetDynamicPstatesInfo",
        "nvmlDeviceGetThermalSettings",
        "nvmlDeviceGetMinMaxFanSpeed",
        "nvmlDeviceGetAttributes",
        "nvmlDeviceGetAttributes_v2",
        "nvmlDeviceGetCpuAffinity",
        "nvmlDeviceGetSramEccErrorStatus",
        "nvmlDeviceGetBusType",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetConfComputeMemSizeInfo",
        "nvmlDeviceGetConfComputeGpuCertificate",
        "nvmlDeviceGetConfComputeProtectedMemoryUsage",
        "nvmlDeviceGetSupportedPerformanceStates",
        "nvmlDeviceGetMinMaxClockOfPState",
        "nvmlDeviceGetClockOffsets",
        "nvmlDeviceGetPerformanceModes",
        "nvmlDeviceGetCurrentClockFreqs",
        "nvmlDeviceGetPowerMizerMode_v1",
        "nvmlDeviceGetPdi",
        "nvmlDeviceGetHostname_v1",
        "nvmlDeviceGetNvLinkInfo",
        "nvmlDeviceGetRepairStatus",
        "nvmlDeviceGetMarginTemperature",
        "nvmlDeviceGetVgpuCapabilities",
        "nvmlDeviceGetSupportedVgpus",
        "nvmlDeviceGetCreatableVgpus",
        "nvmlDeviceGetActiveVgpus",
        "nvmlDeviceGetVgpuHeterogeneousMode",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    ]
    for name in simple:
        d[name] = call(name, h)
    d["nvmlDeviceGetMemoryInfo_v2"] = attempt(lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2))
    for k, v in constants("NVML_TEMPERATURE_THRESHOLD_").items():
        d[f"nvmlDeviceGetTemperatureThreshold[{k}]"] = call("nvmlDeviceGetTemperatureThreshold", h, v)
    d["nvmlDeviceGetTemperature[GPU]"] = call("nvmlDeviceGetTemperature", h, 0)
    for k, v in constants("NVML_CLOCK_").items():
        if k in ("NVML_CLOCK_COUNT",) or k.startswith("NVML_CLOCK_ID"):
            continue
        for fn in (
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetMaxClockInfo",
            "nvmlDeviceGetApplicationsClock",
            "nvmlDeviceGetDefaultApplicationsClock",
            "nvmlDeviceGetMaxCustomerBoostClock",
        ):
            d[f"{fn}[{k}]"] = call(fn, h, v)
        for cid in range(4):
            d[f"nvmlDeviceGetClock[{k},{cid}]"] = call("nvmlDeviceGetClock", h, v, cid)
    mems = d["nvmlDeviceGetSupportedMemoryClocks"].get("ok") or []
    for m in mems:
        d[f"nvmlDeviceGetSupportedGraphicsClocks[{m}]"] = call("nvmlDeviceGetSupportedGraphicsClocks", h, m)
    for k, v in constants("NVML_INFOROM_").items():
        if k == "NVML_INFOROM_COUNT":
            continue
        d[f"nvmlDeviceGetInforomVersion[{k}]"] = call("nvmlDeviceGetInforomVersion", h, v)
    for etype in (0, 1):  # volatile, aggregate
        for err in (0, 1):  # corrected, uncorrected
            d[f"nvmlDeviceGetTotalEccErrors[{err},{etype}]"] = call("nvmlDeviceGetTotalEccErrors", h, err, etype)
            d[f"nvmlDeviceGetDetailedEccErrors[{err},{etype}]"] = call("nvmlDeviceGetDetailedEccErrors", h, err, etype)
            for loc in range(9):
                d[f"nvmlDeviceGetMemoryErrorCounter[{err},{etype},{loc}]"] = call(
                    "nvmlDeviceGetMemoryErrorCounter", h, err, etype, loc
                )
    for cause in (1, 2):
        d[f"nvmlDeviceGetRetiredPages[{cause}]"] = call("nvmlDeviceGetRetiredPages", h, cause)
    for pst in range(16):
        d[f"nvmlDeviceGetMinMaxClockOfPState[{pst}]"] = attempt(
            lambda p=pst: [N.nvmlDeviceGetMinMaxClockOfPState(h, c, p) for c in range(4)]
        )
    for link in range(18):
        d[f"nvmlDeviceGetNvLinkState[{link}]"] = call("nvmlDeviceGetNvLinkState", h, link)
        d[f"nvmlDeviceGetNvLinkVersion[{link}]"] = call("nvmlDeviceGetNvLinkVersion", h, link)
        d[f"nvmlDeviceGetNvLinkRemotePciInfo[{link}]"] = call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        d[f"nvmlDeviceGetNvLinkRemoteDeviceType[{link}]"] = call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        for cap in range(6):
            d[f"nvmlDeviceGetNvLinkCapability[{link},{cap}]"] = call("nvmlDeviceGetNvLinkCapability", h, link, cap)
        for ctr in range(6):
            d[f"nvmlDeviceGetNvLinkErrorCounter[{link},{ctr}]"] = call("nvmlDeviceGetNvLinkErrorCounter", h, link, ctr)
    for t in range(3):
        d[f"nvmlDeviceGetPcieThroughput[{t}]"] = call("nvmlDeviceGetPcieThroughput", h, t)
    for t in range(3):
        d[f"nvmlDeviceGetEncoderCapacity[{t}]"] = call("nvmlDeviceGetEncoderCapacity", h, t)
    for scope in (0, 1):
        d[f"nvmlDeviceGetMemoryAffinity[{scope}]"] = call("nvmlDeviceGetMemoryAffinity", h, 64, scope)
        d[f"nvmlDeviceGetCpuAffinityWithinScope[{scope}]"] = call("nvmlDeviceGetCpuAffinityWithinScope", h, 64, scope)
    for prof in range(16):
        d[f"nvmlDeviceGetGpuInstanceProfileInfo[{prof}]"] = call("nvmlDeviceGetGpuInstanceProfileInfo", h, prof)
    for cap in range(8):
        d[f"nvmlDeviceGetCapabilities?[{cap}]"] = call("nvmlDeviceGetAPIRestriction", h, cap)
    # Every field id one by one.
    fields = {}
    for k, v in sorted(constants("NVML_FI_").items(), key=lambda kv: kv[1]):
        if k in ("NVML_FI_MAX",):
            continue
        try:
            res = N.nvmlDeviceGetFieldValues(h, [v])[0]
            val = None
            if res.nvmlReturn == 0:
                vt = res.valueType
                u = res.value
                val = {
                    0: u.dVal,
                    1: u.uiVal,
                    2: u.ulVal,
                    3: u.ullVal,
                    4: u.sllVal,
                    5: u.siVal,
                    6: getattr(u, "usVal", None),
                }.get(vt)
            fields[f"{k}={v}"] = {"ret": res.nvmlReturn, "type": res.valueType, "value": val, "scopeId": res.scopeId}
        except Exception as exc:
            fields[f"{k}={v}"] = {"exception": str(exc)}
    d["fieldValues"] = fields
    return d


def main():
    N.nvmlInit()
    out = {"system": {}, "devices": []}
    for name in (
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlUnitGetCount",
        "nvmlSystemGetDriverBranch",
        "nvmlSystemGetConfComputeState",
        "nvmlSystemGetConfComputeCapabilities",
        "nvmlSystemGetConfComputeSettings",
        "nvmlSystemGetHicVersion",
        "nvmlSystemGetTopologyGpuSet",
        "nvmlGetExcludedDeviceCount",
        "nvmlSystemGetNvlinkBwMode",
    ):
        out["system"][name] = call(name) if name != "nvmlSystemGetTopologyGpuSet" else call(name, 0)
    out["system"]["pynvml_version"] = getattr(N, "__version__", None)
    count = N.nvmlDeviceGetCount()
    for i in range(count):
        h = N.nvmlDeviceGetHandleByIndex(i)
        out["devices"].append(device_dump(h))
        out["devices"][-1]["nvmlDeviceGetTopologyCommonAncestor[self]"] = call(
            "nvmlDeviceGetTopologyCommonAncestor", h, h
        )
    json.dump(out, sys.stdout, indent=1, sort_keys=True, default=repr)
    N.nvmlShutdown()


if __name__ == "__main__":
    main()
