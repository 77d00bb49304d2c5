package local

import (
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// The PostgreSQL protocol codes a client may open with (protocol.html).
const (
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
	pgCancelRequest = 80877102
	// pgMaxStartup bounds a startup packet, as PostgreSQL does.
	pgMaxStartup = 10000
)

// refuse tells a held client that its service could not be resumed, as
// PostgreSQL tells a client it refuses: the client speaks first, so its
// SSLRequest is answered (with TLS under the service's own certificate
// where dbcloud has it, so a client that verifies the server shows the
// message too; else 'N'), its StartupMessage read, and a FATAL
// ErrorResponse sent before the connection closes.
func refuse(c net.Conn, p *pausedService, reason string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(wakeGreeting))
	msg := fmt.Sprintf("service %s is paused and could not be resumed: %s", p.id, reason)
	conn := c
	for {
		code, err := readStartup(conn)
		if err != nil {
			return
		}
		switch code {
		case pgSSLRequest:
			if p.tls == nil || conn != c {
				if _, err := conn.Write([]byte{'N'}); err != nil {
					return
				}
				continue
			}
			if _, err := conn.Write([]byte{'S'}); err != nil {
				return
			}
			t := tls.Server(c, p.tls)
			if err := t.Handshake(); err != nil {
				return
			}
			conn = t
		case pgGSSENCRequest:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return
			}
		case pgCancelRequest:
			return // nothing to cancel; PostgreSQL answers nothing either
		default:
			conn.Write(errorResponse("FATAL", "57P03", msg))
			return
		}
	}
}

// readStartup reads one untyped startup-phase packet and returns its
// request code (the protocol version of a StartupMessage).
func readStartup(r io.Reader) (uint32, error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(head[:4])
	if n < 8 || n > pgMaxStartup {
		return 0, fmt.Errorf("startup packet of %d bytes", n)
	}
	if _, err := io.CopyN(io.Discard, r, int64(n-8)); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(head[4:]), nil
}

// errorResponse is a PostgreSQL ErrorResponse message.
func errorResponse(severity, sqlstate, msg string) []byte {
	var body []byte
	for _, f := range []struct {
		code byte
		val  string
	}{{'S', severity}, {'V', severity}, {'C', sqlstate}, {'M', msg}} {
		body = append(body, f.code)
		body = append(body, f.val...)
		body = append(body, 0)
	}
	body = append(body, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}
