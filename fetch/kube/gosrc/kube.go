// One program for the six Kubernetes commands the local cluster runs, chosen by the name it is
// run as (the cache holds it as `kubernetes`, with links named after each command). The five share most
// of their code: one binary is a third of their total size and links once.
//
// Each case does what that command's own main package (k8s.io/kubernetes/cmd/<name>) does.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones (kube-apiserver, kube-controller-manager)

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	var command *cobra.Command
	switch name {
	case "kube-apiserver":
		command = apiserver.NewAPIServerCommand()
	case "kube-controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	case "kube-scheduler":
		command = scheduler.NewSchedulerCommand()
	case "kube-proxy":
		command = proxy.NewProxyCommand()
	case "kubelet":
		command = kubelet.NewKubeletCommand(context.Background())
	case "kubectl":
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	default:
		fmt.Fprintf(os.Stderr, "%s: run me as kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet or kubectl\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(command))
}
