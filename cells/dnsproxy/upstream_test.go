package dnsproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/miekg/dns"
)

func question(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reply(req *dns.Msg, rrs ...string) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			panic(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	return m
}

func TestCheckAnswer(t *testing.T) {
	req := question("a.example.", dns.TypeA)
	good := reply(req, "a.example. 60 IN A 192.0.2.1")

	got, err := checkAnswer(req, pack(t, good))
	if err != nil || len(got.Answer) != 1 || got.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
		t.Fatalf("good answer: %v, %v", got, err)
	}

	// The resolver may change the case of the name (0x20).
	mixed := reply(req, "A.Example. 60 IN A 192.0.2.1")
	mixed.Question[0].Name = "A.eXample."
	if _, err := checkAnswer(req, pack(t, mixed)); err != nil {
		t.Errorf("mixed case: %v", err)
	}

	// A bare REFUSED, no question and no record, carries nothing.
	bare := pack(t, &dns.Msg{MsgHdr: dns.MsgHdr{Id: req.Id, Response: true, Rcode: dns.RcodeRefused}})
	if _, err := checkAnswer(req, bare); err != nil {
		t.Errorf("bare REFUSED: %v", err)
	}

	// Several questions: all must match, in order.
	multi := new(dns.Msg)
	multi.Id = dns.Id()
	multi.Question = []dns.Question{{Name: "a.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, {Name: "b.example.", Qtype: dns.TypeAAAA, Qclass: dns.ClassINET}}
	multiAns := new(dns.Msg)
	multiAns.SetReply(multi)
	multiAns.Question = multi.Question
	if _, err := checkAnswer(multi, pack(t, multiAns)); err != nil {
		t.Errorf("two questions: %v", err)
	}

	// A truncated answer whose records do not all parse passes, with its
	// question.
	big := reply(req, "a.example. 60 IN A 192.0.2.1", "a.example. 60 IN A 192.0.2.2")
	big.Truncated = true
	raw := pack(t, big)
	cut := raw[:len(raw)-3]
	if got, err := checkAnswer(req, cut); err != nil || !got.Truncated {
		t.Errorf("truncated and cut: %v, %v", got, err)
	}

	other := reply(question("b.example.", dns.TypeA), "b.example. 60 IN A 192.0.2.9")
	other.Id = req.Id
	otherType := reply(question("a.example.", dns.TypeAAAA))
	otherType.Id = req.Id
	notResponse := reply(req)
	notResponse.Response = false
	withRecordsNoQuestion := reply(req, "a.example. 60 IN A 192.0.2.1")
	withRecordsNoQuestion.Question = nil
	untruncatedCut := pack(t, reply(req, "a.example. 60 IN A 192.0.2.1"))
	wrongID := pack(t, good)
	binary.BigEndian.PutUint16(wrongID, req.Id+1)
	bad := map[string][]byte{
		"other name":               pack(t, other),
		"other type":               pack(t, otherType),
		"not a response":           pack(t, notResponse),
		"records and no question":  pack(t, withRecordsNoQuestion),
		"cut, not truncated":       untruncatedCut[:len(untruncatedCut)-2],
		"short":                    []byte{1, 2, 3},
		"wrong ID":                 wrongID,
		"question cut, truncated":  append(bytes.Clone(raw[:dnsHeaderLen]), 1, 'a'),
		"two questions, one given": pack(t, reply(multi)),
	}
	for name, b := range bad {
		if _, err := checkAnswer(req, b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := checkAnswer(multi, pack(t, reply(multi))); err == nil {
		t.Error("two questions asked, one answered: accepted")
	}
}

func TestServFail(t *testing.T) {
	req := question("a.example.", dns.TypeA)
	req.Question = append(req.Question, dns.Question{Name: "b.example.", Qtype: dns.TypeAAAA, Qclass: dns.ClassINET})
	b, err := servFail(req)
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatal(err)
	}
	if m.Id != req.Id || !m.Response || m.Rcode != dns.RcodeServerFailure || len(m.Question) != 2 || !m.RecursionDesired {
		t.Errorf("SERVFAIL: %v", m)
	}
}

func TestReasonOf(t *testing.T) {
	if got := reasonOf(&failure{ReasonHook, errors.New("x")}); got != ReasonHook {
		t.Errorf("hook failure: %s", got)
	}
	if got := reasonOf(errors.New("x")); got != ReasonUpstream {
		t.Errorf("plain error: %s", got)
	}
}

func TestReadTCPMessage(t *testing.T) {
	msg := func(n int) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(n))
		return append(b, make([]byte, n)...)
	}
	if got, err := readTCPMessage(bytes.NewReader(msg(maxRequest))); err != nil || len(got) != maxRequest {
		t.Errorf("largest: %d bytes, %v", len(got), err)
	}
	if _, err := readTCPMessage(bytes.NewReader(msg(maxRequest + 1))); !errors.Is(err, errTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if _, err := readTCPMessage(bytes.NewReader(msg(100)[:50])); err == nil {
		t.Error("cut message: no error")
	}
}

func TestConfig(t *testing.T) {
	c, err := Config{IPv4: true, Mark: 0x200}.withDefaults()
	if err != nil || c.Timeout != DefaultTimeout || c.MaxInFlight != DefaultMaxInFlight {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	for name, c := range map[string]Config{
		"no family": {Mark: 1},
		"no mark":   {IPv4: true},
		"negative":  {IPv4: true, Mark: 1, Timeout: -1},
	} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
