package rawio

import (
	"bytes"
	"io"
	"net"
	"testing"
)

func TestDisabled(t *testing.T) {
	old := enabled
	enabled = false
	defer func() { enabled = old }()
	w, _ := pair(t)
	if _, ok := w.(*net.TCPConn); !ok {
		t.Fatalf("with INFERROUTE_RAWIO=0, Wrap returned %T; want the *net.TCPConn it was given", w)
	}
}

func TestWriteBuffers(t *testing.T) {
	w, p := pair(t)
	bw := w.(*Conn)
	head := []byte("POST / HTTP/1.1\r\n\r\n")
	body := bytes.Repeat([]byte("x"), 3<<20)
	bufs := net.Buffers{head, nil, body}
	var got []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		got, _ = io.ReadAll(p)
	}()
	n, err := bw.WriteBuffers(&bufs)
	if err != nil || n != int64(len(head)+len(body)) || len(bufs) != 0 {
		t.Fatalf("WriteBuffers = %d, %v, %d buffers left; want %d, nil, 0", n, err, len(bufs), len(head)+len(body))
	}
	w.Close()
	<-done
	if !bytes.Equal(got, append(head, body...)) {
		t.Fatalf("peer read %d bytes, not what was written", len(got))
	}
}
