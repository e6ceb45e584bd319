module mokka.test/nvmlprobe

go 1.21

require github.com/NVIDIA/go-nvml v0.13.4-1
