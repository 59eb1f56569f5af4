// Package sftp is a client for SFTP version 3 (draft-ietf-secsh-filexfer-02) with the
// OpenSSH extensions, written for a FUSE filesystem.
//
// pkg/sftp is the usual Go choice, but its client cannot create a file or directory with
// a mode in one request (a create costs two round trips), has no lsetstat@openssh.com
// (utimens/chown on a symlink would follow it), falls back from REMOVE to RMDIR on any
// failure, and takes no context per request. Every request here takes a context, is
// pipelined on one connection, and returns the server's status unaltered so that the
// caller can recover a precise errno.
package sftp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Packet types (draft-ietf-secsh-filexfer-02, section 3).
const (
	fxpInit          = 1
	fxpVersion       = 2
	fxpOpen          = 3
	fxpClose         = 4
	fxpRead          = 5
	fxpWrite         = 6
	fxpLstat         = 7
	fxpFstat         = 8
	fxpSetstat       = 9
	fxpFsetstat      = 10
	fxpOpendir       = 11
	fxpReaddir       = 12
	fxpRemove        = 13
	fxpMkdir         = 14
	fxpRmdir         = 15
	fxpRealpath      = 16
	fxpStat          = 17
	fxpRename        = 18
	fxpReadlink      = 19
	fxpSymlink       = 20
	fxpStatus        = 101
	fxpHandle        = 102
	fxpData          = 103
	fxpName          = 104
	fxpAttrs         = 105
	fxpExtended      = 200
	fxpExtendedReply = 201
)

// Open flags (pflags).
const (
	FlagRead   = 0x01
	FlagWrite  = 0x02
	FlagAppend = 0x04
	FlagCreate = 0x08
	FlagTrunc  = 0x10
	FlagExcl   = 0x20
)

// Attribute presence flags.
const (
	AttrSize        = 0x01
	AttrUIDGID      = 0x02
	AttrPermissions = 0x04
	AttrACModTime   = 0x08
	attrExtended    = 0x80000000
)

// Status codes.
const (
	StatusOK               = 0
	StatusEOF              = 1
	StatusNoSuchFile       = 2
	StatusPermissionDenied = 3
	StatusFailure          = 4
	StatusBadMessage       = 5
	StatusNoConnection     = 6
	StatusConnectionLost   = 7
	StatusOpUnsupported    = 8
)

// maxPacket bounds what we accept from a server: OpenSSH sends at most 256 KiB plus
// framing; anything far larger is a broken or hostile peer, not a reason to allocate.
const maxPacket = 4 << 20

// Attrs is the SFTP v3 attribute block. Flags says which fields are present.
type Attrs struct {
	Flags uint32
	Size  uint64
	UID   uint32
	GID   uint32
	Mode  uint32 // full st_mode as OpenSSH sends it: type bits and permissions
	Atime uint32
	Mtime uint32
}

// Check reports attributes no file can have. Sizes become int64 offsets everywhere
// above us: a server claiming more than 2^63-1 bytes is broken, and wrapping the
// size negative (or quietly reading it as 0) would show a lie.
func (a Attrs) Check() error {
	if a.Size > math.MaxInt64 {
		return fmt.Errorf("server sent an impossible file size (%d bytes)", a.Size)
	}
	return nil
}

// buffer builds an outgoing packet. The first 4 bytes are the length, filled by finish.
type buffer struct{ b []byte }

func newPacket(typ byte, id uint32) *buffer {
	b := &buffer{b: make([]byte, 4, 64)}
	b.b = append(b.b, typ)
	b.u32(id)
	return b
}

func (b *buffer) u32(v uint32)   { b.b = binary.BigEndian.AppendUint32(b.b, v) }
func (b *buffer) u64(v uint64)   { b.b = binary.BigEndian.AppendUint64(b.b, v) }
func (b *buffer) str(s string)   { b.u32(uint32(len(s))); b.b = append(b.b, s...) }
func (b *buffer) bytes(p []byte) { b.u32(uint32(len(p))); b.b = append(b.b, p...) }
func (b *buffer) attrs(a *Attrs) {
	b.u32(a.Flags)
	if a.Flags&AttrSize != 0 {
		b.u64(a.Size)
	}
	if a.Flags&AttrUIDGID != 0 {
		b.u32(a.UID)
		b.u32(a.GID)
	}
	if a.Flags&AttrPermissions != 0 {
		b.u32(a.Mode)
	}
	if a.Flags&AttrACModTime != 0 {
		b.u32(a.Atime)
		b.u32(a.Mtime)
	}
}

func (b *buffer) finish() []byte { return b.finishWith(0) }

// finishWith sets the length prefix of a packet whose last n bytes are sent after
// b.b, from the caller's buffer.
func (b *buffer) finishWith(n int) []byte {
	binary.BigEndian.PutUint32(b.b, uint32(len(b.b)-4+n))
	return b.b
}

// errShort reports a packet that ends before its fields do: a broken or hostile server.
var errShort = errors.New("sftp: malformed packet from server (too short)")

// reader decodes an incoming packet payload. The first error sticks, so a decoder can
// read all fields and check err once.
type reader struct {
	b   []byte
	err error
}

func (r *reader) u32() uint32 {
	if r.err != nil || len(r.b) < 4 {
		r.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(len(r.b)) {
		r.err = errShort
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string { return string(r.bytes()) }

func (r *reader) attrs() Attrs {
	var a Attrs
	a.Flags = r.u32()
	if a.Flags&AttrSize != 0 {
		a.Size = r.u64()
	}
	if a.Flags&AttrUIDGID != 0 {
		a.UID = r.u32()
		a.GID = r.u32()
	}
	if a.Flags&AttrPermissions != 0 {
		a.Mode = r.u32()
	}
	if a.Flags&AttrACModTime != 0 {
		a.Atime = r.u32()
		a.Mtime = r.u32()
	}
	if a.Flags&attrExtended != 0 {
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			r.bytes()
			r.bytes()
		}
	}
	return a
}

// StatusError is an SFTP status other than OK, with the request it answered.
type StatusError struct {
	Op   string
	Path string
	Code uint32
	Msg  string
}

func (e *StatusError) Error() string {
	name := statusNames[e.Code]
	if name == "" {
		name = fmt.Sprintf("status %d", e.Code)
	}
	if e.Msg != "" && e.Msg != name {
		name += " (" + e.Msg + ")"
	}
	if e.Path == "" {
		return fmt.Sprintf("sftp %s: %s", e.Op, name)
	}
	return fmt.Sprintf("sftp %s %s: %s", e.Op, e.Path, name)
}

var statusNames = map[uint32]string{
	StatusEOF:              "end of file",
	StatusNoSuchFile:       "no such file",
	StatusPermissionDenied: "permission denied",
	StatusFailure:          "failure",
	StatusBadMessage:       "bad message",
	StatusNoConnection:     "no connection",
	StatusConnectionLost:   "connection lost",
	StatusOpUnsupported:    "operation unsupported",
}

// IsStatus reports whether err is an SFTP status error with the given code.
func IsStatus(err error, code uint32) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}
