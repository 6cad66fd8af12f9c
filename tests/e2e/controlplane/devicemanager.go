package main

// kubelet-device-manager: kubelet's side of the device plugin API (v1beta1), built on kubelet's
// own API package, for the e2e suite's fake kubelet. It serves Registration on
// <dir>/kubelet.sock; for each plugin that registers it connects back, watches ListAndWatch and
// prints every device list; on a command it asks the plugin for a preferred allocation of
// healthy, unallocated devices and allocates them, as kubelet's device manager does when it
// admits a pod. With --pod-resources it also serves kubelet's PodResources API (v1, List) on
// that socket: each pod admitted, or being admitted, with its containers and the devices
// allocated to them (as kubelet lists a pod from the start of its admission). One JSON object per
// line: commands on stdin, events on stdout.
//
//	{"allocate": {"resource": "edgegpu.io/gpu-mem-block", "size": 1, "pod": "ns/name",
//	              "container": "app"}}
//	{"release": {"pod": "ns/name"}}   (the pod is gone: kubelet frees its devices)
//	{"restart": true}   (what a kubelet restart does: every socket in <dir> goes, then back)

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type plugin struct {
	client    pluginapi.DevicePluginClient
	conn      *grpc.ClientConn
	options   *pluginapi.DevicePluginOptions
	devices   map[string]string // ID → health
	allocated map[string]bool
}

type manager struct {
	pluginapi.UnimplementedRegistrationServer
	dir     string
	mu      sync.Mutex
	plugins map[string]*plugin
	// pod "ns/name" → container → resource → device IDs, as kubelet's checkpoint keeps them.
	given map[string]map[string]map[string][]string
	// pods whose admission failed: kubelet no longer counts them active, nor lists them.
	failed map[string]bool
	out    *json.Encoder
	outMu  sync.Mutex
	server *grpc.Server
}

func (m *manager) emit(event map[string]any) {
	m.outMu.Lock()
	defer m.outMu.Unlock()
	_ = m.out.Encode(event)
}

func (m *manager) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", req.Version)
	}
	endpoint := filepath.Join(m.dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	options, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	p := &plugin{client: client, conn: conn, options: options, devices: map[string]string{}, allocated: map[string]bool{}}
	m.mu.Lock()
	if old := m.plugins[req.ResourceName]; old != nil {
		old.conn.Close()
		p.allocated = old.allocated // kubelet keeps its checkpoint across a plugin's restart
	}
	m.plugins[req.ResourceName] = p
	m.mu.Unlock()
	m.emit(map[string]any{"event": "registered", "resource": req.ResourceName, "endpoint": req.Endpoint,
		"preferred_allocation": options.GetPreferredAllocationAvailable})
	go m.watch(req.ResourceName, p)
	return &pluginapi.Empty{}, nil
}

func (m *manager) watch(resource string, p *plugin) {
	stream, err := p.client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		m.emit(map[string]any{"event": "error", "error": err.Error()})
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			// As kubelet (PluginDisconnected): the resource's devices turn unhealthy at once,
			// unless the plugin has registered again meanwhile.
			m.mu.Lock()
			current := m.plugins[resource] == p
			var list []map[string]string
			if current {
				for id := range p.devices {
					p.devices[id] = pluginapi.Unhealthy
					list = append(list, map[string]string{"id": id, "health": pluginapi.Unhealthy})
				}
			}
			m.mu.Unlock()
			if current {
				m.emit(map[string]any{"event": "devices", "resource": resource, "devices": list})
			}
			m.emit(map[string]any{"event": "disconnected", "resource": resource, "error": err.Error()})
			return
		}
		devices := map[string]string{}
		var list []map[string]string
		for _, d := range resp.Devices {
			devices[d.ID] = d.Health
			list = append(list, map[string]string{"id": d.ID, "health": d.Health})
		}
		m.mu.Lock()
		p.devices = devices
		m.mu.Unlock()
		m.emit(map[string]any{"event": "devices", "resource": resource, "devices": list})
	}
}

// podResources is kubelet's PodResources API over what was allocated.
type podResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	m *manager
}

func (r *podResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	resp := &podresourcesapi.ListPodResourcesResponse{}
	pods := make([]string, 0, len(r.m.given))
	for pod := range r.m.given {
		if !r.m.failed[pod] {
			pods = append(pods, pod)
		}
	}
	slices.Sort(pods)
	for _, pod := range pods {
		ns, name, _ := strings.Cut(pod, "/")
		out := &podresourcesapi.PodResources{Namespace: ns, Name: name}
		for container, byResource := range r.m.given[pod] {
			c := &podresourcesapi.ContainerResources{Name: container}
			for resource, ids := range byResource {
				c.Devices = append(c.Devices, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: ids})
			}
			out.Containers = append(out.Containers, c)
		}
		resp.PodResources = append(resp.PodResources, out)
	}
	return resp, nil
}

func (m *manager) allocate(resource string, size int, pod, container string) (out map[string]any) {
	defer func() {
		if out["event"] == "error" {
			m.mu.Lock()
			m.failed[pod] = true
			m.mu.Unlock()
		}
	}()
	m.mu.Lock()
	p := m.plugins[resource]
	// As kubelet's pod manager: the pod is listed (with no devices yet) from the start of its
	// admission; a pod that fails it is no longer active, and no longer listed.
	delete(m.failed, pod)
	if m.given[pod] == nil {
		m.given[pod] = map[string]map[string][]string{}
	}
	if m.given[pod][container] == nil {
		m.given[pod][container] = map[string][]string{}
	}
	var available []string
	if p != nil {
		for id, health := range p.devices {
			if health == pluginapi.Healthy && !p.allocated[id] {
				available = append(available, id)
			}
		}
	}
	m.mu.Unlock()
	if p == nil {
		return map[string]any{"event": "error", "pod": pod, "error": "no plugin for " + resource}
	}
	slices.Sort(available)
	if len(available) < size {
		return map[string]any{"event": "error", "pod": pod, "error": "not enough healthy devices"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chosen := available[:size]
	if p.options.GetPreferredAllocationAvailable {
		pref, err := p.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: available, AllocationSize: int32(size)}}})
		if err != nil {
			return map[string]any{"event": "error", "pod": pod, "error": err.Error()}
		}
		if len(pref.ContainerResponses) != 1 {
			return map[string]any{"event": "error", "pod": pod, "error": "no preferred allocation for the container"}
		}
		// As kubelet: only available devices count, and the rest is filled up to size.
		seen := map[string]bool{}
		chosen = nil
		for _, id := range append(pref.ContainerResponses[0].DeviceIDs, available...) {
			if len(chosen) < size && !seen[id] && slices.Contains(available, id) {
				seen[id] = true
				chosen = append(chosen, id)
			}
		}
	}
	resp, err := p.client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: chosen}}})
	if err != nil {
		return map[string]any{"event": "error", "pod": pod, "error": err.Error()}
	}
	if len(resp.ContainerResponses) != 1 {
		return map[string]any{"event": "error", "pod": pod, "error": "no allocation for the container"}
	}
	m.mu.Lock()
	for _, id := range chosen {
		p.allocated[id] = true
	}
	if m.given[pod] == nil {
		m.given[pod] = map[string]map[string][]string{}
	}
	if m.given[pod][container] == nil {
		m.given[pod][container] = map[string][]string{}
	}
	m.given[pod][container][resource] = chosen
	m.mu.Unlock()
	return map[string]any{"event": "allocated", "pod": pod, "devices": chosen, "envs": resp.ContainerResponses[0].Envs}
}

// release frees the devices of a pod that is gone, as kubelet does once its containers ended.
func (m *manager) release(pod string) map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	freed := 0
	for _, byResource := range m.given[pod] {
		for resource, ids := range byResource {
			if p := m.plugins[resource]; p != nil {
				for _, id := range ids {
					delete(p.allocated, id)
					freed++
				}
			}
		}
	}
	delete(m.given, pod)
	delete(m.failed, pod)
	return map[string]any{"event": "released", "pod": pod, "devices": freed}
}

func (m *manager) serve() error {
	sock := filepath.Join(m.dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	m.server = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(m.server, m)
	go func() { _ = m.server.Serve(lis) }()
	m.emit(map[string]any{"event": "serving", "socket": sock})
	return nil
}

func (m *manager) restart() error {
	m.server.Stop()
	socks, _ := filepath.Glob(filepath.Join(m.dir, "*.sock"))
	for _, s := range socks {
		_ = os.Remove(s)
	}
	return m.serve()
}

func runDeviceManager(args []string) int {
	flags := flag.NewFlagSet("kubelet-device-manager", flag.ContinueOnError)
	dir := flags.String("dir", pluginapi.DevicePluginPath, "the device-plugins folder")
	podResourcesSocket := flags.String("pod-resources", "", "serve the PodResources API on this socket")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	m := &manager{dir: *dir, plugins: map[string]*plugin{}, out: json.NewEncoder(os.Stdout),
		given: map[string]map[string]map[string][]string{}, failed: map[string]bool{}}
	if err := m.serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *podResourcesSocket != "" {
		_ = os.MkdirAll(filepath.Dir(*podResourcesSocket), 0o755)
		_ = os.Remove(*podResourcesSocket)
		lis, err := net.Listen("unix", *podResourcesSocket)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		server := grpc.NewServer()
		podresourcesapi.RegisterPodResourcesListerServer(server, &podResources{m: m})
		go func() { _ = server.Serve(lis) }()
		defer server.Stop()
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd struct {
			Allocate *struct {
				Resource  string `json:"resource"`
				Size      int    `json:"size"`
				Pod       string `json:"pod"`
				Container string `json:"container"`
			} `json:"allocate"`
			Release *struct {
				Pod string `json:"pod"`
			} `json:"release"`
			Restart bool `json:"restart"`
		}
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			m.emit(map[string]any{"event": "error", "error": err.Error()})
			continue
		}
		switch {
		case cmd.Allocate != nil:
			m.emit(m.allocate(cmd.Allocate.Resource, cmd.Allocate.Size, cmd.Allocate.Pod, cmd.Allocate.Container))
		case cmd.Release != nil:
			m.emit(m.release(cmd.Release.Pod))
		case cmd.Restart:
			if err := m.restart(); err != nil {
				m.emit(map[string]any{"event": "error", "error": err.Error()})
			}
		}
	}
	m.server.Stop()
	return 0
}
