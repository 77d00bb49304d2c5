package postgres

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func newTestPlanes(t *testing.T) *planes {
	t.Helper()
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlanes(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustReceive(t *testing.T, p *planes, msgs ...string) {
	t.Helper()
	for _, m := range msgs {
		if err := p.receive(m); err != nil {
			t.Fatalf("receive %q: %v", m, err)
		}
	}
}

// TestPlanes_StaleByeIsIgnored: a bye that arrives after a later beat of
// its plane (sent on a connection given up for dead, committed late) does
// not make writers stop waiting for that plane, whose lease the later
// beat may have renewed.
func TestPlanes_StaleByeIsIgnored(t *testing.T) {
	p := newTestPlanes(t)
	mustReceive(t, p, "beat b 7", "bye b 5")
	if _, ok := p.heard["b"]; !ok {
		t.Fatal("bye b 5 after beat b 7: writers no longer wait for b")
	}
	mustReceive(t, p, "bye b 7")
	if _, ok := p.heard["b"]; ok {
		t.Fatal("bye b 7 after beat b 7: writers still wait for b")
	}
	// Heard again after its bye: waited for again, until its next bye.
	mustReceive(t, p, "fence b 1")
	if _, ok := p.heard["b"]; !ok {
		t.Fatal("fence b 1 after the bye: writers do not wait for b")
	}
	mustReceive(t, p, "bye b 7")
	if _, ok := p.heard["b"]; ok {
		t.Fatal("a second bye b 7: writers still wait for b")
	}
}

// TestPlanes_AwayRetractsBeats: once its follower lost its connection, a
// plane says bye once, forgets the beats sent before it (so that none of
// them renews its lease on the next connection), says nothing more until
// the follower listens again, and then beats at once, above its bye.
func TestPlanes_AwayRetractsBeats(t *testing.T) {
	p := newTestPlanes(t)
	if msgs, _, _, _ := p.outbox(); len(msgs) > 0 {
		t.Fatalf("before the follower listened: said %q, want nothing", msgs)
	}
	p.listen(time.Now())
	mustReceive(t, p, "fence w 3")
	msgs, _, _, _ := p.outbox()
	if want := fmt.Sprintf("beat %s 1", p.id); !slices.Contains(msgs, want) {
		t.Fatalf("once listening: said %q, want %q among it", msgs, want)
	}
	mustReceive(t, p, "fence w 4")
	p.listen(time.Time{})
	p.asked = 1 // a writer waits meanwhile
	msgs, _, _, bye := p.outbox()
	want := []string{fmt.Sprintf("ack %s w 4", p.id), fmt.Sprintf("bye %s 1", p.id)}
	if !slices.Equal(msgs, want) || !bye {
		t.Fatalf("follower away: said %q (bye %v), want %q", msgs, bye, want)
	}
	if len(p.beats) > 0 {
		t.Errorf("after the bye, beats %v may still renew the lease", p.beats)
	}
	p.beatDue = true
	if msgs, _, _, _ := p.outbox(); len(msgs) > 0 {
		t.Errorf("still away: said %q, want nothing", msgs)
	}
	p.listen(time.Now())
	msgs, _, _, _ = p.outbox()
	want = []string{fmt.Sprintf("fence %s 1", p.id), fmt.Sprintf("beat %s 2", p.id)}
	if !slices.Equal(msgs, want) {
		t.Errorf("listening again: said %q, want %q", msgs, want)
	}
}

// TestPlanes_FailedByeIsSaidAgain: a bye whose send failed is said again
// while the follower is still away.
func TestPlanes_FailedByeIsSaidAgain(t *testing.T) {
	p := newTestPlanes(t)
	p.listen(time.Now())
	p.outbox()
	p.listen(time.Time{})
	_, fence, acks, bye := p.outbox()
	p.sentOK(fence, acks, bye, false)
	if msgs, _, _, bye := p.outbox(); !bye {
		t.Errorf("after a failed bye: said %q, want the bye again", msgs)
	}
}

// TestPlanes_StalledFollowerSaysBye: a plane whose follower listens but
// does not receive its beats back says bye once its lease has run out,
// not before (until then its Store may answer from memory, and writers
// must wait for it); it forgets the beats sent before the bye, says
// nothing more, not even acks, until its follower receives the bye back,
// and then beats at once, above its bye.
func TestPlanes_StalledFollowerSaysBye(t *testing.T) {
	p := newTestPlanes(t)
	p.listen(time.Now())
	p.outbox() // beat 1, which does not come back
	p.unheard = time.Now().Add(-stallAfter)
	p.until = time.Now().Add(leaseTTL / 2) // from a beat before it
	p.beatDue = true
	msgs, _, _, bye := p.outbox()
	if bye || !slices.Contains(msgs, fmt.Sprintf("beat %s 2", p.id)) {
		t.Fatalf("stalled, within its lease: said %q (bye %v), want beat 2 and no bye", msgs, bye)
	}
	mustReceive(t, p, "fence w 3")
	p.until = time.Now() // the lease is over
	msgs, _, _, bye = p.outbox()
	want := []string{fmt.Sprintf("ack %s w 3", p.id), fmt.Sprintf("bye %s 2", p.id)}
	if !slices.Equal(msgs, want) || !bye {
		t.Fatalf("stalled, lease over: said %q (bye %v), want %q", msgs, bye, want)
	}
	if len(p.beats) > 0 {
		t.Errorf("after the bye, beats %v may still renew the lease", p.beats)
	}
	mustReceive(t, p, "fence w 4")
	p.asked = 1 // a writer waits meanwhile
	p.beatDue = true
	if msgs, _, _, _ := p.outbox(); len(msgs) > 0 {
		t.Fatalf("mute: said %q, want nothing", msgs)
	}
	mustReceive(t, p, fmt.Sprintf("bye %s 2", p.id))
	msgs, _, _, _ = p.outbox()
	want = []string{fmt.Sprintf("fence %s 1", p.id), fmt.Sprintf("ack %s w 4", p.id), fmt.Sprintf("beat %s 3", p.id)}
	if !slices.Equal(msgs, want) {
		t.Errorf("hearing its bye: said %q, want %q", msgs, want)
	}
}
