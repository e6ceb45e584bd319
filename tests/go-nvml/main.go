// nvmlprobe: a go-nvml program, as NVIDIA's device plugin and GFD are, printing what it
// sees as JSON. Used by tests/test_go_nvml.py against Mokka's library.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

type gpu struct {
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	Minor       int    `json:"minor"`
	BusID       string `json:"bus_id"`
	DeviceID    uint32 `json:"pci_device_id"`
	CCMajor     int    `json:"cc_major"`
	CCMinor     int    `json:"cc_minor"`
	MemoryTotal uint64 `json:"memory_total"`
	MigHandle   string `json:"mig_handle"`
	ByUUID      bool   `json:"by_uuid"`
}

type report struct {
	Driver    string `json:"driver"`
	Cuda      int    `json:"cuda"`
	GPUs      []gpu  `json:"gpus"`
	Topology  int    `json:"topology"`
	EventWait string `json:"event_wait"`
}

func check(what string, ret nvml.Return) {
	if ret != nvml.SUCCESS {
		fmt.Fprintf(os.Stderr, "%s: %s\n", what, nvml.ErrorString(ret))
		os.Exit(1)
	}
}

func main() {
	check("Init", nvml.Init())
	defer nvml.Shutdown()
	var r report
	var ret nvml.Return
	r.Driver, ret = nvml.SystemGetDriverVersion()
	check("SystemGetDriverVersion", ret)
	r.Cuda, ret = nvml.SystemGetCudaDriverVersion()
	check("SystemGetCudaDriverVersion", ret)
	count, ret := nvml.DeviceGetCount()
	check("DeviceGetCount", ret)
	var devices []nvml.Device
	for i := 0; i < count; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		check("DeviceGetHandleByIndex", ret)
		devices = append(devices, d)
		var g gpu
		g.Name, ret = d.GetName()
		check("GetName", ret)
		g.UUID, ret = d.GetUUID()
		check("GetUUID", ret)
		g.Minor, ret = d.GetMinorNumber()
		check("GetMinorNumber", ret)
		pci, ret := d.GetPciInfo()
		check("GetPciInfo", ret)
		for _, c := range pci.BusId {
			if c == 0 {
				break
			}
			g.BusID += string(rune(c))
		}
		g.DeviceID = pci.PciDeviceId
		g.CCMajor, g.CCMinor, ret = d.GetCudaComputeCapability()
		check("GetCudaComputeCapability", ret)
		mem, ret := d.GetMemoryInfo()
		check("GetMemoryInfo", ret)
		g.MemoryTotal = mem.Total
		_, ret = d.GetMigDeviceHandleByIndex(0)
		g.MigHandle = nvml.ErrorString(ret)
		_, ret = nvml.DeviceGetHandleByUUID(g.UUID)
		g.ByUUID = ret == nvml.SUCCESS
		r.GPUs = append(r.GPUs, g)
	}
	if len(devices) > 1 {
		level, ret := devices[0].GetTopologyCommonAncestor(devices[1])
		check("GetTopologyCommonAncestor", ret)
		r.Topology = int(level)
	}
	set, ret := nvml.EventSetCreate()
	check("EventSetCreate", ret)
	check("RegisterEvents", devices[0].RegisterEvents(nvml.EventTypeXidCriticalError, set))
	_, ret = set.Wait(50)
	r.EventWait = nvml.ErrorString(ret)
	check("EventSetFree", set.Free())
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}
