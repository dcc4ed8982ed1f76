// Command apiload measures kube-apiserver in front of a given etcd-compatible
// store (cairn or etcd): it starts kube-apiserver alone against --etcd-servers,
// sends an open-loop client-go load at fixed rates (ConfigMap creates, updates,
// gets and paged lists, and Lease renewals) and reports latency percentiles
// per verb, plus kube-apiserver's CPU time and RSS. See README.md.
package main

import (
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

// options are the command-line flags.
type options struct {
	etcdServers    []string
	kubeBinDir     string
	dir            string
	keep           bool
	json           bool
	seconds        float64
	warmup         float64
	objects        int
	leases         int
	valueSize      int
	pageSize       int64
	maxInFlight    int
	requestTimeout time.Duration
	readyTimeout   time.Duration
	apiserverArgs  []string
	rates          map[string]*float64 // per verb, requests per second
}

func parseFlags() *options {
	o := &options{rates: map[string]*float64{}}
	var etcd string
	flag.StringVar(&etcd, "etcd-servers", "", "comma-separated client URLs of the store, passed to kube-apiserver's --etcd-servers (required)")
	flag.StringVar(&o.kubeBinDir, "kube-bin-dir", os.Getenv("KUBE_BIN_DIR"), "directory holding the kube-apiserver binary (default $KUBE_BIN_DIR)")
	flag.StringVar(&o.dir, "dir", "", "work dir for the PKI and kube-apiserver's log (default: a new temp dir, removed at the end unless --keep; a given dir is never removed)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temp work dir")
	flag.BoolVar(&o.json, "json", false, "print the report as one JSON object on stdout")
	flag.Float64Var(&o.seconds, "seconds", 30, "measured seconds of load")
	flag.Float64Var(&o.warmup, "warmup", 10, "seconds of load before the measured window (not reported)")
	flag.IntVar(&o.objects, "objects", 500, "ConfigMaps created beforehand in namespace load, for updates, gets and lists")
	flag.IntVar(&o.leases, "leases", 100, "Leases created beforehand in namespace load, renewed in turn")
	flag.IntVar(&o.valueSize, "value-size", 1024, "bytes in each ConfigMap's data value")
	flag.Int64Var(&o.pageSize, "page-size", 50, "Limit of each page of a list")
	flag.IntVar(&o.maxInFlight, "max-inflight", 512, "most requests in flight at once; a request waiting for a free slot is sent late")
	flag.DurationVar(&o.requestTimeout, "request-timeout", 30*time.Second, "client-side timeout of each request")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 4*time.Minute, "how long to wait for kube-apiserver's /readyz")
	flag.Func("apiserver-arg", "extra kube-apiserver flag, e.g. --apiserver-arg=--v=2 (repeatable)", func(s string) error {
		o.apiserverArgs = append(o.apiserverArgs, s)
		return nil
	})
	for _, v := range verbNames {
		o.rates[v] = flag.Float64(v+"-rate", defaultRates[v], "offered "+verbHelp[v]+" per second (0: none)")
	}
	flag.Parse()
	if flag.NArg() > 0 {
		usage("unexpected arguments: %v", flag.Args())
	}
	for _, u := range strings.Split(etcd, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.etcdServers = append(o.etcdServers, u)
		}
	}
	switch {
	case len(o.etcdServers) == 0:
		usage("--etcd-servers is required")
	case o.kubeBinDir == "":
		usage("--kube-bin-dir (or $KUBE_BIN_DIR) is required")
	case o.seconds <= 0 || o.warmup < 0:
		usage("--seconds must be > 0 and --warmup >= 0")
	case o.objects < 1 || o.leases < 1 || o.pageSize < 1 || o.maxInFlight < 1:
		usage("--objects, --leases, --page-size and --max-inflight must be >= 1")
	}
	for v, r := range o.rates {
		if *r < 0 {
			usage("--%s-rate must be >= 0", v)
		}
	}
	return o
}

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "apiload: "+format+"\n\n", args...)
	flag.Usage()
	os.Exit(2)
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("apiload: ")
	log.SetOutput(os.Stderr)
	if err := run(parseFlags()); err != nil {
		// Last, after kube-apiserver is stopped, so that it ends the output.
		log.Printf("FAILED: %v", err)
		os.Exit(1)
	}
}

// run does the whole job: start kube-apiserver, prepare, load, report, stop.
func run(o *options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin := filepath.Join(o.kubeBinDir, "kube-apiserver")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("kube-apiserver binary: %w", err)
	}
	dir, cleanup, err := workDir(o)
	if err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	defer cleanup()

	pki, err := controlplane.GeneratePKI(dir)
	if err != nil {
		return fmt.Errorf("generating the PKI: %w", err)
	}
	log.Printf("starting %s against %s (work dir %s)", bin, strings.Join(o.etcdServers, ","), dir)
	start := time.Now()
	api, err := controlplane.StartAPIServer(ctx, controlplane.APIServerConfig{
		BinDir:       o.kubeBinDir,
		Dir:          dir,
		EtcdServers:  o.etcdServers,
		PKI:          pki,
		ExtraArgs:    o.apiserverArgs,
		ReadyTimeout: o.readyTimeout,
	})
	if api != nil {
		defer func() {
			log.Printf("stopping kube-apiserver (pid %d)", api.Pid())
			api.Stop()
		}()
	}
	if err != nil {
		if api != nil {
			log.Printf("last 40 lines of %s:\n%s", api.LogPath, controlplane.TailFile(api.LogPath, 40))
		}
		return fmt.Errorf("kube-apiserver never became ready: %w", err)
	}
	log.Printf("kube-apiserver ready after %v at %s (pid %d)", time.Since(start).Round(time.Millisecond), api.URL, api.Pid())

	cfg := api.RESTConfig()
	// Never throttle on the client side; speak protobuf as controllers do.
	cfg.QPS = 100000
	cfg.Burst = 100000
	cfg.Timeout = o.requestTimeout
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.UserAgent = "apiload"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	version := apiserverVersion(client, bin)

	w, err := prepare(ctx, client, o)
	if err != nil {
		return fmt.Errorf("preparing the objects: %w", err)
	}
	res, err := runLoad(ctx, w, o, api.Pid())
	if err != nil {
		return err
	}
	rep := buildReport(o, res, version)
	if o.json {
		err = rep.writeJSON(os.Stdout)
	} else {
		err = rep.writeTable(os.Stdout)
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if !api.Alive() {
		return fmt.Errorf("kube-apiserver exited during the load: %v", api.ExitErr())
	}
	if rep.writeRateOffered() && rep.WriteCount == 0 {
		return errors.New("the load produced no successful writes (see the error samples in the report)")
	}
	return nil
}

// workDir returns the directory to work in and a function that removes it if
// it was made here and --keep is not set.
func workDir(o *options) (string, func(), error) {
	if o.dir != "" {
		if err := os.MkdirAll(o.dir, 0o755); err != nil {
			return "", nil, err
		}
		abs, err := filepath.Abs(o.dir)
		return abs, func() {}, err
	}
	dir, err := os.MkdirTemp("", "apiload-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() {
		if o.keep {
			log.Printf("work dir kept: %s", dir)
			return
		}
		os.RemoveAll(dir)
	}, nil
}

// apiserverVersion is the version kube-apiserver reports on /version, or, when
// that is the placeholder of a build without version stamping, the version of
// the k8s.io/kubernetes module the binary was built from.
func apiserverVersion(client kubernetes.Interface, bin string) string {
	reported := ""
	if v, err := client.Discovery().ServerVersion(); err != nil {
		log.Printf("GET /version: %v", err)
	} else {
		reported = v.GitVersion
	}
	if reported != "" && !strings.HasPrefix(reported, "v0.0.0") {
		return reported
	}
	info, err := buildinfo.ReadFile(bin)
	if err == nil && info.Main.Path == "k8s.io/kubernetes" && info.Main.Version != "" {
		return info.Main.Version
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Printf("reading the build info of %s: %v", bin, err)
	}
	return reported
}
