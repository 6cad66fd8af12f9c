// Command controlplane starts one component of a Kubernetes control plane, built from the
// Kubernetes Go modules at the release go.mod pins. The component is the first argument
// (or the name the program is called by): etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, kubectl, version, or kubelet-device-manager (kubelet's side of the
// device plugin API, for the e2e suite's fake kubelet). The remaining arguments are the
// component's own flags, exactly as its upstream binary takes them.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // for CronJob time zones, as the upstream binaries do

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func(args []string) int{
	"etcd": runEtcd,
	"kube-apiserver": func(args []string) int {
		return runCobra(apiserver.NewAPIServerCommand(), args)
	},
	"kube-scheduler": func(args []string) int {
		return runCobra(scheduler.NewSchedulerCommand(), args)
	},
	"kube-controller-manager": func(args []string) int {
		return runCobra(controllermanager.NewControllerManagerCommand(), args)
	},
	"kubelet": func(args []string) int {
		return runCobra(kubelet.NewKubeletCommand(context.Background()), args)
	},
	"kubectl": runKubectl,
	"version": runVersion,
	// kubelet's device-plugin side, for the fake kubelet (devicemanager.go).
	"kubelet-device-manager": runDeviceManager,
}

func runCobra(cmd *cobra.Command, args []string) int {
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

func runKubectl(args []string) int {
	os.Args = append([]string{"kubectl"}, args...)
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck
	cmd := kubectl.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(cmd); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func runVersion(_ []string) int {
	info := version.Get()
	fmt.Printf("kubernetes %s (%s, %s)\netcd %s\n", info.GitVersion, info.GoVersion, info.Platform, etcdVersion())
	return 0
}

func names() string {
	var out []string
	for name := range components {
		out = append(out, name)
	}
	return strings.Join(out, ", ")
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	run, ok := components[name]
	if !ok {
		if len(args) == 0 {
			fmt.Fprintf(os.Stderr, "usage: %s COMPONENT [FLAGS]; COMPONENT is one of %s\n", name, names())
			os.Exit(2)
		}
		run, ok = components[args[0]]
		if !ok {
			fmt.Fprintf(os.Stderr, "%s: unknown component %q; one of %s\n", name, args[0], names())
			os.Exit(2)
		}
		args = args[1:]
	}
	os.Exit(run(args))
}
