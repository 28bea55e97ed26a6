package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// sockets are the proxy's sockets of one family: where TPROXY delivers the
// pods' DNS (udp, tcp) and the raw socket UDP answers leave by (reply.go).
type sockets struct {
	v6    bool
	udp   *net.UDPConn
	tcp   *net.TCPListener
	reply *replySocket
}

func (s *sockets) close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{s.udp, s.tcp, s.reply} {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openSockets opens the sockets of the families asked on port, the same
// port for both transports and families; port 0 takes the port the
// first socket got, and tries again a few times if another is taken.
func openSockets(ctx context.Context, ipv4, ipv6 bool, port uint16) ([]*sockets, uint16, error) {
	var families []bool
	if ipv4 {
		families = append(families, false)
	}
	if ipv6 {
		families = append(families, true)
	}
	const attempts = 10
	for i := 0; ; i++ {
		all, got, err := openAll(ctx, families, port)
		if err == nil {
			return all, got, nil
		}
		if port != 0 || i == attempts-1 || !errors.Is(err, unix.EADDRINUSE) {
			return nil, 0, err
		}
	}
}

func openAll(ctx context.Context, families []bool, port uint16) (all []*sockets, _ uint16, err error) {
	defer func() {
		if err != nil {
			for _, s := range all {
				s.close()
			}
		}
	}()
	for _, v6 := range families {
		// Only whole families go into all (what the deferred close
		// closes): a family's sockets opened before an error are closed
		// here.
		s := &sockets{v6: v6}
		if s.udp, err = listenUDP(ctx, v6, port); err != nil {
			return all, 0, err
		}
		port = uint16(s.udp.LocalAddr().(*net.UDPAddr).Port)
		if s.tcp, err = listenTCP(ctx, v6, port); err != nil {
			s.udp.Close()
			return all, 0, err
		}
		if s.reply, err = listenReply(ctx, v6); err != nil {
			s.udp.Close()
			s.tcp.Close()
			return all, 0, err
		}
		all = append(all, s)
	}
	return all, port, nil
}

// wildcard is the address the family's sockets bind to: TPROXY's
// --on-ip (127.0.0.1, ::1) finds a socket bound to the wildcard.
func wildcard(v6 bool, port uint16) string {
	a := netip.IPv4Unspecified()
	if v6 {
		a = netip.IPv6Unspecified()
	}
	return net.JoinHostPort(a.String(), strconv.Itoa(int(port)))
}

func network(base string, v6 bool) string {
	if v6 {
		return base + "6"
	}
	return base + "4"
}

// listenUDP opens the transparent UDP socket of a family: IP_TRANSPARENT
// lets TPROXY give it datagrams for any address, IP_RECVORIGDSTADDR says
// which address each was for; an IPv6 socket takes IPv6 only.
func listenUDP(ctx context.Context, v6 bool, port uint16) (*net.UDPConn, error) {
	opts := []sockopt{{unix.SOL_IP, unix.IP_TRANSPARENT}, {unix.SOL_IP, unix.IP_RECVORIGDSTADDR}}
	if v6 {
		opts = []sockopt{{unix.SOL_IPV6, unix.IPV6_V6ONLY}, {unix.SOL_IPV6, unix.IPV6_TRANSPARENT}, {unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR}}
	}
	lc := net.ListenConfig{Control: setOpts(opts)}
	c, err := lc.ListenPacket(ctx, network("udp", v6), wildcard(v6, port))
	if err != nil {
		return nil, fmt.Errorf("transparent UDP socket: %w", err)
	}
	return c.(*net.UDPConn), nil
}

// listenTCP opens the transparent TCP listener of a family: an accepted
// connection's local address is the one the pod connected to.
func listenTCP(ctx context.Context, v6 bool, port uint16) (*net.TCPListener, error) {
	opts := []sockopt{{unix.SOL_IP, unix.IP_TRANSPARENT}}
	if v6 {
		opts = []sockopt{{unix.SOL_IPV6, unix.IPV6_V6ONLY}, {unix.SOL_IPV6, unix.IPV6_TRANSPARENT}}
	}
	lc := net.ListenConfig{Control: setOpts(opts)}
	l, err := lc.Listen(ctx, network("tcp", v6), wildcard(v6, port))
	if err != nil {
		return nil, fmt.Errorf("transparent TCP listener: %w", err)
	}
	return l.(*net.TCPListener), nil
}

// sockopt is an integer socket option set to 1.
type sockopt struct{ level, name int }

// setOpts is a ListenConfig.Control that sets opts before the bind.
func setOpts(opts []sockopt) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var err error
		cerr := c.Control(func(fd uintptr) {
			for _, o := range opts {
				if err = unix.SetsockoptInt(int(fd), o.level, o.name, 1); err != nil {
					err = fmt.Errorf("setsockopt %d/%d: %w", o.level, o.name, err)
					return
				}
			}
		})
		return errors.Join(cerr, err)
	}
}
