package test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/test/k8stest"
)

// A real CoreDNS for the tests that need a resolver: the binary
// test/k8stest/coredns-build/build.sh (`make coredns`, part of `make
// k8s-bins`) builds from the Go module proxy and caches.

// corednsVersion is the version build.sh builds; its cache directory is
// named after it.
const corednsVersion = "v1.15.0"

// corednsBinary returns the cached coredns,
// ${XDG_CACHE_HOME:-~/.cache}/enimasq/coredns-v1.15.0/coredns (the path
// build.sh -dir prints), or an error that says how to build it.
func corednsBinary() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "enimasq", "coredns-"+corednsVersion, "coredns")
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not built: run `make coredns` (test/k8stest/coredns-build/build.sh, about 9 minutes the first time)", bin)
	}
	return bin, nil
}

// coreDNS is a CoreDNS serving a fixed set of records from a zone file,
// authoritatively, for every name: one zone, the root, so that names of
// any domain, wildcards and CNAME chains across domains all resolve from
// it, and every other name is NXDOMAIN (nothing is forwarded anywhere).
type coreDNS struct {
	// Addr is listenIP:53, where it answers over UDP and TCP.
	Addr string

	t      testing.TB
	ns     netns.NsHandle
	zone   string // the zone file
	ttl    uint32
	serial uint32 // of the zone last written
	out    *syncBuffer
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// corednsReload is how often the file plugin looks at the zone file; it
// loads it when the SOA serial went up (SetRecords raises it).
const corednsReload = 100 * time.Millisecond

// corednsTimeout bounds the wait for a start or a SetRecords to be served.
const corednsTimeout = 30 * time.Second

// startCoreDNS runs CoreDNS in the named network namespace (ip netns),
// listening on listenIP port 53 over UDP and TCP, serving records: a name
// ("www.example.com", "*.example.com" for a wildcard, a trailing dot
// optional) to its values, each an IPv4 address (A), an IPv6 address
// (AAAA) or "CNAME target." (the name's only value then), every record
// with the TTL ttl (also the negative-caching TTL of the SOA). A CNAME is
// followed within the records; a target outside them is answered as the
// CNAME alone. The errors plugin logs, the log plugin (queries) is off.
// It returns once it answers over UDP and TCP; it is killed at cleanup,
// and on a failure of the test its output is logged. Without the binary
// the test is skipped (failed if $ENIMASQ_REQUIRE_K8S is set, as make test
// does).
func startCoreDNS(t testing.TB, netnsName, listenIP string, records map[string][]string, ttl uint32) *coreDNS {
	t.Helper()
	bin, err := corednsBinary()
	if err != nil {
		if os.Getenv(k8stest.RequireEnv) != "" {
			t.Fatalf("%s is set: %s", k8stest.RequireEnv, err)
		}
		t.Skipf("needs CoreDNS: %s", err)
	}
	ip, err := netip.ParseAddr(listenIP)
	if err != nil {
		t.Fatalf("listen address: %s", err)
	}
	dir := t.TempDir()
	c := &coreDNS{
		Addr: net.JoinHostPort(ip.String(), "53"),
		t:    t,
		ns:   nsHandle(t, netnsName),
		zone: filepath.Join(dir, "db.root"),
		ttl:  ttl,
		out:  &syncBuffer{},
	}
	c.writeZone(records)
	corefile := filepath.Join(dir, "Corefile")
	celltest.WriteFileAtomic(t, corefile, fmt.Sprintf(`.:53 {
	bind %s
	errors
	file %s . {
		reload %s
	}
}
`, ip, c.zone, corednsReload))

	// ip netns exec execs coredns: the PID stays coredns's.
	c.cmd = exec.Command("ip", "netns", "exec", netnsName, bin, "-conf", corefile)
	c.cmd.Dir = dir
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out // coredns logs to stdout
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := corednsStart(c.cmd); err != nil {
		t.Fatalf("start coredns: %s", err)
	}
	c.exited = make(chan struct{})
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("coredns output:\n%s", c.out.String())
		}
	})
	c.waitServing()
	return c
}

// corednsLauncher is a goroutine locked to its OS thread for the life of
// the test process, from which coredns is forked: the parent-death signal
// fires when the forking thread exits, and Go ends a thread when a
// goroutine that locked it exits (as network-namespace helpers may), so
// only the test process's end kills coredns (as k8stest does for its
// processes).
var corednsLauncher = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked
		for f := range ch {
			f()
		}
	}()
	return ch
})

func corednsStart(cmd *exec.Cmd) error {
	done := make(chan error)
	corednsLauncher() <- func() { done <- cmd.Start() }
	return <-done
}

// SetRecords replaces the records served (same form as startCoreDNS's).
// It rewrites the zone file (renamed over the old one) with the SOA
// serial one higher; the file plugin looks at the file every 100 ms and
// loads it when the serial went up. SetRecords returns once the new
// serial is answered over UDP and TCP: from then on every query sees the
// new records (answers cached by a client may live on up to the TTL).
// Call it from the test's goroutine (it fails the test).
func (c *coreDNS) SetRecords(records map[string][]string) {
	c.t.Helper()
	c.writeZone(records)
	c.waitServing()
}

// writeZone writes the zone file of records with the next serial, failing
// the test on a record CoreDNS would not load (rather than have it keep
// the old zone).
func (c *coreDNS) writeZone(records map[string][]string) {
	c.t.Helper()
	c.serial++
	const ns = "ns.enimasq.test."
	var b strings.Builder
	fmt.Fprintf(&b, "; written by startCoreDNS (test/coredns_helpers_test.go)\n$ORIGIN .\n$TTL %d\n", c.ttl)
	fmt.Fprintf(&b, ".\t%d\tIN\tSOA\t%s hostmaster.enimasq.test. %d 3600 600 86400 %d\n", c.ttl, ns, c.serial, c.ttl)
	fmt.Fprintf(&b, ".\t%d\tIN\tNS\t%s\n", c.ttl, ns)
	for _, name := range slices.Sorted(maps.Keys(records)) {
		owner := dns.Fqdn(name)
		if _, ok := dns.IsDomainName(owner); !ok || owner == "." {
			c.t.Fatalf("coredns record %q: not a domain name", name)
		}
		values := records[name]
		for _, v := range values {
			var line string
			if f := strings.Fields(v); len(f) == 2 && strings.EqualFold(f[0], "CNAME") {
				if len(values) != 1 {
					c.t.Fatalf("coredns record %q: a CNAME must be the name's only value, got %q", name, values)
				}
				line = fmt.Sprintf("%s %d IN CNAME %s", owner, c.ttl, dns.Fqdn(f[1]))
			} else if ip, err := netip.ParseAddr(v); err == nil && ip.Zone() == "" {
				typ := "A"
				if !ip.Unmap().Is4() {
					typ = "AAAA"
				}
				line = fmt.Sprintf("%s %d IN %s %s", owner, c.ttl, typ, ip.Unmap())
			} else {
				c.t.Fatalf("coredns record %q: value %q is neither an IP address nor \"CNAME target.\"", name, v)
			}
			rr, err := dns.NewRR(line)
			if err != nil {
				c.t.Fatalf("coredns record %q: %s", name, err)
			}
			b.WriteString(rr.String() + "\n")
		}
	}
	celltest.WriteFileAtomic(c.t, c.zone, b.String())
}

// waitServing waits until the SOA of the zone last written is answered
// over UDP and TCP, failing the test if coredns exits or corednsTimeout
// passes.
func (c *coreDNS) waitServing() {
	c.t.Helper()
	deadline := time.Now().Add(corednsTimeout)
	for {
		err := c.serving()
		if err == nil {
			return
		}
		select {
		case <-c.exited:
			c.t.Fatalf("coredns exited (%v) before serving serial %d; output:\n%s", c.err, c.serial, c.out.String())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("coredns not serving serial %d after %s: %s; output:\n%s", c.serial, corednsTimeout, err, c.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *coreDNS) serving() error {
	for _, network := range []string{"udp", "tcp"} {
		r, err := c.Query(network, ".", dns.TypeSOA)
		if err != nil {
			return fmt.Errorf("%s: %w", network, err)
		}
		if len(r.Answer) != 1 {
			return fmt.Errorf("%s: SOA query answered %v", network, r)
		}
		soa, ok := r.Answer[0].(*dns.SOA)
		if !ok {
			return fmt.Errorf("%s: SOA query answered %s", network, r.Answer[0])
		}
		if soa.Serial != c.serial {
			return fmt.Errorf("%s: serial %d served", network, soa.Serial)
		}
	}
	return nil
}

// Query asks the server for name's records of type qtype (dns.TypeA...)
// over network ("udp" or "tcp"), from inside its network namespace,
// with a 2 s timeout.
func (c *coreDNS) Query(network, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	client := &dns.Client{Net: network, Timeout: 2 * time.Second}
	var r *dns.Msg
	err := celltest.InNS(c.ns, func() error {
		var err error
		r, _, err = client.Exchange(m, c.Addr)
		return err
	})
	if err == nil && r == nil {
		err = errors.New("no answer")
	}
	return r, err
}

// TestPrivilegedCoreDNS: the helper's CoreDNS, in a netns of its own,
// answers exact names, wildcards, a CNAME chain across domains, A and AAAA,
// NXDOMAIN and NODATA, over UDP and TCP, with the TTL asked for, and
// serves new records after SetRecords.
func TestPrivilegedCoreDNS(t *testing.T) {
	celltest.RequireRoot(t)
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "enq-dns-" + hex.EncodeToString(suffix)
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	const server = "10.96.0.10" // a kube-dns-like ClusterIP, on lo
	run(t, "ip", "-n", ns, "addr", "add", server+"/32", "dev", "lo")

	c := startCoreDNS(t, ns, server, map[string][]string{
		"www.example.com":    {"192.0.2.10", "192.0.2.11"},
		"*.apps.example.com": {"192.0.2.20"},
		"v6.example.com":     {"2001:db8::6"},
		"dual.example.com.":  {"192.0.2.30", "2001:db8::30"},
		"alias.example.org":  {"CNAME alias2.example.net."},
		"alias2.example.net": {"CNAME www.example.com."},
	}, 42)
	if c.Addr != "10.96.0.10:53" {
		t.Fatalf("Addr %s", c.Addr)
	}

	type q struct {
		name  string
		qtype uint16
		rcode int
		want  []string // "owner TYPE value", in any order
	}
	check := func(t *testing.T, network string, qs []q) {
		t.Helper()
		for _, q := range qs {
			r, err := c.Query(network, q.name, q.qtype)
			if err != nil {
				t.Errorf("%s %s %s: %s", network, q.name, dns.TypeToString[q.qtype], err)
				continue
			}
			var got []string
			for _, rr := range r.Answer {
				h := rr.Header()
				if h.Ttl != 42 {
					t.Errorf("%s %s %s: TTL %d in %s, want 42", network, q.name, dns.TypeToString[q.qtype], h.Ttl, rr)
				}
				got = append(got, strings.ToLower(h.Name)+" "+dns.TypeToString[h.Rrtype]+" "+strings.TrimPrefix(rr.String(), h.String()))
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(q.want))
			if r.Rcode != q.rcode || !r.Authoritative || !slices.Equal(got, want) {
				t.Errorf("%s %s %s: %s aa=%t %q, want %s aa=true %q", network, q.name, dns.TypeToString[q.qtype],
					dns.RcodeToString[r.Rcode], r.Authoritative, got, dns.RcodeToString[q.rcode], want)
			}
		}
	}
	const ok, nx = dns.RcodeSuccess, dns.RcodeNameError
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			check(t, network, []q{
				{"www.example.com", dns.TypeA, ok, []string{"www.example.com. A 192.0.2.10", "www.example.com. A 192.0.2.11"}},
				{"WWW.Example.COM.", dns.TypeA, ok, []string{"www.example.com. A 192.0.2.10", "www.example.com. A 192.0.2.11"}},
				{"foo.apps.example.com", dns.TypeA, ok, []string{"foo.apps.example.com. A 192.0.2.20"}},
				{"a.b.apps.example.com", dns.TypeA, ok, []string{"a.b.apps.example.com. A 192.0.2.20"}},
				{"v6.example.com", dns.TypeAAAA, ok, []string{"v6.example.com. AAAA 2001:db8::6"}},
				{"dual.example.com", dns.TypeA, ok, []string{"dual.example.com. A 192.0.2.30"}},
				{"dual.example.com", dns.TypeAAAA, ok, []string{"dual.example.com. AAAA 2001:db8::30"}},
				{"alias.example.org", dns.TypeA, ok, []string{
					"alias.example.org. CNAME alias2.example.net.",
					"alias2.example.net. CNAME www.example.com.",
					"www.example.com. A 192.0.2.10", "www.example.com. A 192.0.2.11",
				}},
				{"www.example.com", dns.TypeAAAA, ok, nil}, // NODATA
				{"apps.example.com", dns.TypeA, ok, nil},   // empty non-terminal
				{"nope.example.com", dns.TypeA, nx, nil},
				{"example.org", dns.TypeA, ok, nil},
				{"nope.invalid", dns.TypeA, nx, nil},
			})
		})
	}

	c.SetRecords(map[string][]string{
		"www.example.com":   {"192.0.2.99"},
		"alias.example.org": {"CNAME www.example.com"},
		"new.example.com":   {"2001:db8::99"},
	})
	for _, network := range []string{"udp", "tcp"} {
		t.Run("reloaded-"+network, func(t *testing.T) {
			check(t, network, []q{
				{"www.example.com", dns.TypeA, ok, []string{"www.example.com. A 192.0.2.99"}},
				{"alias.example.org", dns.TypeA, ok, []string{"alias.example.org. CNAME www.example.com.", "www.example.com. A 192.0.2.99"}},
				{"new.example.com", dns.TypeAAAA, ok, []string{"new.example.com. AAAA 2001:db8::99"}},
				{"foo.apps.example.com", dns.TypeA, nx, nil},
				{"v6.example.com", dns.TypeAAAA, nx, nil},
			})
		})
	}
}
