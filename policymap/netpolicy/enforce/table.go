package enforce

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/tablesync"
)

// TableName is the name of the attachments table.
const TableName = "policy-attachments"

// Attachment is a pod device that carries the policy programs.
type Attachment struct {
	// Device is the host-side device's name; Ifindex its index (a device
	// deleted and made again has a new index: the row changes).
	Device  string
	Ifindex int
	// Pods are the pod IPs routed to the device.
	Pods   []netip.Addr
	Status reconciler.Status
}

func (a *Attachment) Clone() *Attachment { c := *a; return &c }

func (a *Attachment) GetStatus() reconciler.Status { return a.Status }

func (a *Attachment) SetStatus(s reconciler.Status) *Attachment {
	a.Status = s
	return a
}

// sameDesired compares everything but the status.
func (a *Attachment) sameDesired(o *Attachment) bool {
	return a.Device == o.Device && a.Ifindex == o.Ifindex && slices.Equal(a.Pods, o.Pods)
}

func (a *Attachment) TableHeader() []string {
	return []string{"Device", "Ifindex", "Pods", "Status", "Error"}
}

func (a *Attachment) TableRow() []string {
	pods := make([]string, len(a.Pods))
	for i, p := range a.Pods {
		pods[i] = p.String()
	}
	return []string{a.Device, strconv.Itoa(a.Ifindex), strings.Join(pods, ","), a.Status.Kind.String(), a.Status.GetError()}
}

// DeviceIndex is the primary index: the device's name.
var DeviceIndex = tablesync.StringIndex("device", func(a *Attachment) string { return a.Device })

// NewTable creates and registers the attachments table.
func NewTable(db *statedb.DB) (statedb.RWTable[*Attachment], error) {
	return statedb.NewTable(db, TableName, DeviceIndex)
}
