package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"dbcloud/sqlstore"
)

// Read-your-writes across planes.
//
// Each plane answers cached reads from change counters kept in memory,
// moved by the other planes' commits as their notifications arrive
// (follow.go). A notification reaches a plane a moment after the commit
// is visible, so without more a client that got its answer from plane A
// and at once asks plane B could be answered from B's older counters.
// Asking the store on every read would close that gap at the price of a
// round trip per read; waiting in the writer closes it for free on reads:
//
//   - Every plane says on planesChannel, over a connection of its own (the
//     sender), who it is and what it has applied: "beat ID K" every
//     beatEvery, "ack ID WRITER N" once its follower applied writer's
//     fence N, "bye ID K" (below). PostgreSQL delivers every
//     notification of the database to each listener in commit order, so
//     a message's arrival says everything committed before it arrived
//     before it.
//   - Lease: a plane answers from memory only until leaseTTL after it sent
//     a beat that its own follower has since received back: by then the
//     follower had applied every commit made before that beat. A follower
//     that stalls without failing (a frozen server process, a cut cable)
//     stops receiving its beats, so its plane reads the store within
//     leaseTTL, without having to notice the stall.
//   - Fence: after a commit that moved a counter, the writer has its
//     sender announce "fence ID N" (one fence serves every commit that
//     asked before it was sent) and its Update returns once its own
//     follower has received the fence (so it has heard every plane's
//     messages sent before), and every plane it heard from within
//     leaseTTL (+ clockSlack) has acked N or has gone silent for that
//     long. A plane heard from earlier, or never, holds no lease that
//     could still answer from counters older than the commit.
//   - Bound: whatever happens to connections, the wait ends leaseTTL +
//     clockSlack after the commit: any lease a plane holds from a beat
//     sent before the commit has run out by then, and a lease from a
//     later beat covers the commit. So a plane that does not ack in time
//     costs writers at most that, and only while it has recently beaten.
//   - Bye: a plane whose follower lost its connection (or that closes)
//     says "bye ID K", K its last beat, and then nothing until its
//     follower listens again; writers stop waiting for it at once instead
//     of for their whole bound, for as long as it is away. From then on
//     it renews its lease only from beats numbered above K; and a writer
//     ignores a bye if it heard a beat above K from that plane before
//     (such a bye was sent on a connection given up for dead, and
//     committed late). Why that is safe: the bye is said only once the
//     plane's Store answers nothing from memory under the lease of a beat
//     up to K (after UnfollowRevisions, its next connection starting
//     without a lease (FollowRevisions); or once that lease ran out, see
//     Mute), and those beats are forgotten with the bye, so the plane
//     answers from memory again only within the lease of a beat k > K.
//     Take a writer that stopped waiting for the plane at a bye that
//     arrived before its fence N, with nothing from that plane
//     after the bye and before N. Had k been committed before N, then
//     either before the writer's follower listened, and its lease ended
//     within the quiet period the writer waits out anyway; or the writer
//     received k, after the bye (then it would wait for the plane again)
//     or before it (then it ignored the bye, unless it had stopped
//     counting the plane leaseTTL + clockSlack after k arrived, when k's
//     lease had ended). So k was committed after N, after the commit, and
//     the lease it gives covers the commit.
//   - Mute: a follower can also stall without losing its connection (a
//     frozen server process, a cut cable the kernel has not noticed yet).
//     Its sender would go on beating over its own connection, and every
//     other plane's writes would wait their whole bound for as long as
//     the stall lasts. So a plane whose follower listens but has not
//     received back, within stallAfter, a beat sent since (stalled), once
//     its lease has run out, says bye K like a plane whose follower lost
//     its connection, forgets its beats up to K, and is silent (no beat,
//     fence or ack, any of which would make the others wait for it again)
//     until its follower receives that bye back (it hears again: it beats
//     at once, K+1) or listens anew. The bye's premise holds: the lease
//     the plane gave its Store is known here (until, moved only by renew,
//     under mu), so when outbox finds it over, the Store answers nothing
//     from memory any more, and in the same step, under mu, the beats up
//     to K are forgotten: none of them renews it later, whenever it comes
//     back. A follower that lags by more than a lease instead of stalling
//     is treated alike: it could not answer from memory anyway.
//
// An unchanged cached read thus costs no round trip; a write costs the
// fence's trip to every live plane and back (measured in
// BenchmarkUpdateServicePlanes). Clocks: durations are compared across
// planes; planes on one host share the clock, and clockSlack covers the
// rates of different hosts' clocks drifting apart.
const (
	planesChannel = "dbcloud_planes"
	senderName    = "dbcloud planes"

	leaseTTL   = time.Second
	beatEvery  = leaseTTL / 4
	clockSlack = leaseTTL / 10
	// sendTimeout bounds one send; a sender that hangs longer reconnects.
	sendTimeout = leaseTTL
	// stallAfter is how long a beat may take to come back before the
	// follower counts as stalled (Mute); in the steady state the lease,
	// which runs out three beats after the last one that came back,
	// decides first.
	stallAfter = leaseTTL / 2
)

// planes is one plane's side of the protocol above: what its follower
// heard, what its writers wait for, and what its sender must say.
type planes struct {
	id     string
	store  *sqlstore.Store
	cfg    *pgx.ConnConfig
	logger *slog.Logger
	wake   chan struct{} // the sender has something to say

	mu sync.Mutex
	// changed is closed and replaced whenever a waiting writer may be done.
	changed chan struct{}
	// listening is when the follower's current connection had begun to
	// listen (zero while it has none); seenListening is that of the
	// connection that received fence seen.
	listening, seenListening time.Time
	heard                    map[string]heardFrom // plane -> when its last message arrived
	acked                    map[string]uint64    // plane -> the last of our fences it applied
	asked, sent, seen        uint64               // our fences: asked for, sent, received back
	toAck                    map[string]uint64    // writer -> its last fence applied here, to ack
	beat                     uint64               // our last beat
	beats                    map[uint64]time.Time // our beats not yet received back -> when sent
	beatDue                  bool
	// unheard is when the oldest of our beats that our follower has not
	// received back was sent (zero: none since the last bye or listen).
	unheard time.Time
	// until is the end of the longest lease we gave the Store.
	until time.Time
	// away: we said bye (or nothing yet) since our follower last listened,
	// or since it last heard our bye (mute).
	away bool
	// mute: our follower listens but stopped hearing our beats; we say
	// bye and then nothing until it hears the bye (Mute above).
	mute bool

	cancel context.CancelFunc
	done   sync.WaitGroup
}

func newPlanes(cfg *pgx.ConnConfig, s *sqlstore.Store) (*planes, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("name the plane: %w", err)
	}
	id := hex.EncodeToString(b[:])
	cfg = cfg.Copy()
	cfg.RuntimeParams["application_name"] = senderName
	return &planes{
		id: id, store: s, cfg: cfg,
		logger:  slog.Default().With("component", "store", "channel", planesChannel, "plane", id),
		wake:    make(chan struct{}, 1),
		changed: make(chan struct{}),
		heard:   map[string]heardFrom{}, acked: map[string]uint64{},
		toAck: map[string]uint64{}, beats: map[uint64]time.Time{},
		// Until its follower listens a plane has nothing to say: it has
		// no lease, and its fences could not come back.
		away: true,
	}, nil
}

// heardFrom is what a plane last said: when, and its highest beat since
// it was (again) heard, which makes older byes stale.
type heardFrom struct {
	at   time.Time
	beat uint64
}

// awaitSeen returns once no other plane can answer a read from counters
// older than a commit that returned at committed (sqlstore.AfterCommit).
// It does not give up on a cancelled request: the commit is made, and the
// wait is bounded anyway.
func (p *planes) awaitSeen(committed time.Time) {
	deadline := committed.Add(leaseTTL + clockSlack)
	p.mu.Lock()
	p.asked++
	n := p.asked
	p.mu.Unlock()
	p.poke()
	for {
		p.mu.Lock()
		done, recheck := p.covered(n, time.Now())
		changed := p.changed
		p.mu.Unlock()
		if done {
			return
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			p.logger.Debug("writer waited its whole bound for the other planes")
			return
		}
		if !recheck.IsZero() {
			wait = min(wait, time.Until(recheck))
		}
		timer := time.NewTimer(wait)
		select {
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// covered reports whether fence n has been applied by every plane that
// may still answer from memory; if not, recheck is when that may change
// without a message (zero: only with one). Called with mu held.
func (p *planes) covered(n uint64, now time.Time) (ok bool, recheck time.Time) {
	if p.seen < n {
		return false, time.Time{}
	}
	// A plane may have beaten before our follower listened, unheard.
	if quiet := p.seenListening.Add(leaseTTL + clockSlack); now.Before(quiet) {
		return false, quiet
	}
	for plane, h := range p.heard {
		gone := h.at.Add(leaseTTL + clockSlack)
		if !now.Before(gone) {
			delete(p.heard, plane)
			delete(p.acked, plane)
			continue
		}
		if p.acked[plane] < n && (recheck.IsZero() || gone.Before(recheck)) {
			recheck = gone
		}
	}
	return recheck.IsZero(), recheck
}

// listen says the follower listens since at (zero: it lost its
// connection, and the Store no longer answers from memory). The sender
// says bye when it lost it, and beats at once when it listens again, so
// that the lease is back soon.
func (p *planes) listen(at time.Time) {
	p.mu.Lock()
	p.listening = at
	// A new connection, or none, ends a stall: a mute bye already said
	// counts as the bye of a connection lost; one not yet said is said
	// by outbox if the follower lost its connection.
	p.mute, p.unheard = false, time.Time{}
	if !at.IsZero() {
		p.beatDue = true
	}
	p.mu.Unlock()
	p.poke()
}

// hear notes a message from another plane. Called with mu held.
func (p *planes) hear(from string, now time.Time) {
	h := p.heard[from]
	h.at = now
	p.heard[from] = h
}

// receive handles a message on planesChannel, in the order the follower
// receives them, after every revision notification before it. An error
// says that the message could not be read; it then changed nothing.
func (p *planes) receive(payload string) error {
	f := strings.Fields(payload)
	// Anyone may NOTIFY on the channel: quote no more than a glance.
	if len(f) < 2 {
		return fmt.Errorf("plane message %.40q: too short", payload)
	}
	kind, from := f[0], f[1]
	num := func(i int) (uint64, error) {
		if len(f) <= i {
			return 0, fmt.Errorf("plane message %.40q: too short", payload)
		}
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("plane message %.40q: field %d is no number", payload, i+1)
		}
		return n, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	switch kind {
	case "beat":
		k, err := num(2)
		if err != nil {
			return err
		}
		if from == p.id {
			p.renew(k)
			return nil
		}
		p.heard[from] = heardFrom{at: now, beat: max(p.heard[from].beat, k)}
	case "fence":
		n, err := num(2)
		if err != nil {
			return err
		}
		if from == p.id {
			if n > p.seen {
				p.seen, p.seenListening = n, p.listening
				p.broadcast()
			}
			return nil
		}
		p.hear(from, now)
		p.toAck[from] = max(p.toAck[from], n)
		p.poke()
	case "ack":
		n, err := num(3)
		if err != nil {
			return err
		}
		if from == p.id {
			return nil
		}
		p.hear(from, now)
		if f[2] == p.id && n > p.acked[from] {
			p.acked[from] = n
			p.broadcast()
		}
	case "bye":
		k, err := num(2)
		if err != nil {
			return err
		}
		if from == p.id {
			// Our mute bye is back: the follower hears again. (An older
			// bye of ours says a lower K: beats were sent since.)
			if p.mute && p.away && k == p.beat {
				p.mute, p.beatDue = false, true
				p.poke()
			}
			return nil
		}
		if p.heard[from].beat > k {
			return nil
		}
		delete(p.heard, from)
		delete(p.acked, from)
		p.broadcast()
	default:
		return fmt.Errorf("plane message %.40q: unknown kind", payload)
	}
	return nil
}

// renew extends the lease with our beat k, just received back. Called
// with mu held.
func (p *planes) renew(k uint64) {
	sentAt, ok := p.beats[k]
	if !ok {
		return
	}
	p.unheard = time.Time{}
	for b, at := range p.beats {
		if b <= k {
			delete(p.beats, b)
		} else if p.unheard.IsZero() || at.Before(p.unheard) {
			p.unheard = at
		}
	}
	until := sentAt.Add(leaseTTL)
	if until.After(p.until) {
		p.until = until
	}
	p.store.RenewRevisionLease(until)
}

// stalled reports whether our follower listens but has not received back
// for stallAfter a beat sent since, and the lease it gave has run out
// (Mute above). Called with mu held.
func (p *planes) stalled(now time.Time) bool {
	return !p.listening.IsZero() && !p.unheard.IsZero() &&
		now.Sub(p.unheard) >= stallAfter && !now.Before(p.until)
}

func (p *planes) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// poke wakes the sender.
func (p *planes) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// outbox takes what the sender must say now: while the follower does not
// listen, or is mute, a bye once and then nothing (our fences wait until
// it listens or hears again). A beat's time is taken here, before it is
// sent, so that the lease it gives is never too long.
func (p *planes) outbox() (msgs []string, fence uint64, acks map[string]uint64, bye bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listening.IsZero() || p.mute || p.stalled(time.Now()) {
		p.mute = !p.listening.IsZero()
		if p.away {
			return nil, 0, nil, false
		}
		// Acks first: said before the bye, they make no writer wait.
		acks = p.takeAcks(&msgs)
		return append(msgs, p.bye()), 0, acks, true
	}
	p.away = false
	if p.asked > p.sent {
		fence = p.asked
		msgs = append(msgs, fmt.Sprintf("fence %s %d", p.id, fence))
	}
	acks = p.takeAcks(&msgs)
	if p.beatDue {
		p.beatDue = false
		p.beat++
		now := time.Now()
		p.beats[p.beat] = now
		if p.unheard.IsZero() {
			p.unheard = now
		}
		msgs = append(msgs, fmt.Sprintf("beat %s %d", p.id, p.beat))
		// Beats lost with a connection would pile up otherwise.
		for b, at := range p.beats {
			if now.Sub(at) > leaseTTL {
				delete(p.beats, b)
			}
		}
	}
	return msgs, fence, acks, false
}

// takeAcks appends the acks due to msgs and returns them. Called with mu
// held.
func (p *planes) takeAcks(msgs *[]string) map[string]uint64 {
	acks := p.toAck
	p.toAck = map[string]uint64{}
	for writer, n := range acks {
		*msgs = append(*msgs, fmt.Sprintf("ack %s %s %d", p.id, writer, n))
	}
	return acks
}

// bye returns our bye, and forgets every beat sent so far: no beat sent
// before it may renew the lease once it is said (see Bye above). Called
// with mu held.
func (p *planes) bye() string {
	clear(p.beats)
	p.unheard = time.Time{}
	p.away = true
	return fmt.Sprintf("bye %s %d", p.id, p.beat)
}

// sentOK records what one send delivered, or puts back what it failed to.
// A bye that failed is said again if the follower is still away; if it
// listens again first, the bye is not needed: without it writers wait for
// us as before, and the beats it retracted stay forgotten.
func (p *planes) sentOK(fence uint64, acks map[string]uint64, bye, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		p.sent = max(p.sent, fence)
		return
	}
	for writer, n := range acks {
		p.toAck[writer] = max(p.toAck[writer], n)
	}
	if bye {
		p.away = false
	}
}

// start runs the sender until stop.
func (p *planes) start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.done.Add(1)
	go p.run(ctx)
}

// stop says goodbye, so that writers stop waiting for this plane, and ends
// the sender. Call it once the follower stopped (Bye above).
func (p *planes) stop() {
	p.cancel()
	p.done.Wait()
}

func (p *planes) run(ctx context.Context) {
	defer p.done.Done()
	reconnecting(ctx, p.logger, "store plane messages lost; writers wait their whole bound until reconnected", p.send)
}

// send connects and says what outbox has, at once when poked and every
// beatEvery, until the connection fails or ctx ends.
func (p *planes) send(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	ticker := time.NewTicker(beatEvery)
	defer ticker.Stop()
	p.mu.Lock()
	p.beatDue = true
	p.mu.Unlock()
	for {
		msgs, fence, acks, bye := p.outbox()
		if len(msgs) > 0 {
			// Finished even if stop comes meanwhile, so that what it
			// says (the bye of a follower stopped first) is said.
			err := p.say(context.WithoutCancel(ctx), conn, msgs)
			p.sentOK(fence, acks, bye, err == nil)
			if err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			p.mu.Lock()
			away := p.away
			bye := p.bye()
			p.mu.Unlock()
			if away {
				return nil // said already
			}
			return p.say(context.WithoutCancel(ctx), conn, []string{bye})
		case <-p.wake:
		case <-ticker.C:
			p.mu.Lock()
			p.beatDue = true
			p.mu.Unlock()
		}
	}
}

// say sends msgs in one transaction.
func (p *planes) say(ctx context.Context, conn *pgx.Conn, msgs []string) error {
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, `SELECT pg_notify($1, m) FROM unnest($2::text[]) AS m`, planesChannel, msgs)
	if err != nil {
		return fmt.Errorf("notify %s: %w", planesChannel, err)
	}
	return nil
}
