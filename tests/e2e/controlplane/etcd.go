package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/embed"
)

func etcdVersion() string { return etcdversion.Version }

// runEtcd starts a single-member etcd on loopback URLs until SIGTERM or SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "folder for etcd's data (required)")
	client := fs.String("listen-client-urls", "http://127.0.0.1:2379", "client URL to listen on")
	peer := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL to listen on")
	logLevel := fs.String("log-level", "warn", "etcd's log level")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	clientURL, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-urls: %v\n", err)
		return 2
	}
	peerURL, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-urls: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = *logLevel
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd %s ready on %s\n", etcdVersion(), clientURL)
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready within 60 s")
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		fmt.Fprintf(os.Stderr, "etcd: %s, stopping\n", sig)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
