package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 with common
// name cn and its key to certPath and keyPath (each renamed into place)
// and returns the certificate.
func selfSigned(t *testing.T, cn, certPath, keyPath string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	writeFile(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	writeFile(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	return cert
}

// TestTLSServingAndRenewal serves the gateway over HTTPS with the file
// watch wired as main wires it: HTTP/2 with streaming, a plain HTTP
// request refused, a renewed certificate served to new connections
// without a restart, a broken key refused with the running certificate
// kept, and TLS left on when a reload turns it off (a restart setting).
func TestTLSServingAndRenewal(t *testing.T) {
	a := newPod(t, nil)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	roots := x509.NewCertPool()
	roots.AddCert(selfSigned(t, "gw-a", certPath, keyPath))
	cfgPath := filepath.Join(dir, "gateway.yaml")
	tlsYAML := "tls: {certFile: " + certPath + ", keyFile: " + keyPath + "}\n"
	writeFile(t, cfgPath, gatewayYAML(a.addr())+tlsYAML)
	cfg, err := LoadConfig(cfgPath)
	require.NoError(t, err)

	var logs syncBuf
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	loads := make(chan configLoad)
	hup := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go watchConfig(ctx, cfgPath, 5*time.Millisecond, hup, nil, loads)
	go func() { done <- run(ctx, cfg, ln, log, runOptions{reloads: loads}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("run did not return")
		}
	})
	url := "https://" + ln.Addr().String()

	// get makes a new connection (a new handshake) and returns the
	// response and the common name of the certificate served.
	get := func(method, path, body string) (*http.Response, string, string) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(method, url+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp, resp.TLS.PeerCertificates[0].Subject.CommonName, string(b)
	}
	served := func() string {
		_, cn, _ := get(http.MethodGet, "/v1/models", "")
		return cn
	}

	resp, cn, body := get(http.MethodPost, "/v1/chat/completions",
		`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, resp.StatusCode, body)
	assert.Equal(t, "gw-a", cn)
	assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2 over TLS")
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), "the stream relayed whole over HTTP/2: %q", body)
	resp, _, body = get(http.MethodPost, "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, resp.StatusCode, body)
	assert.Contains(t, body, `"usage"`)

	plain, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	_ = plain.Body.Close()
	assert.Equal(t, http.StatusBadRequest, plain.StatusCode, "plain HTTP to the TLS listener")

	// Renewed in place: the watch sees the files change.
	roots.AddCert(selfSigned(t, "gw-b", certPath, keyPath))
	require.Eventually(t, func() bool { return served() == "gw-b" }, 10*time.Second, 10*time.Millisecond,
		"the renewed certificate is served: %s", logs.String())

	// A broken key is refused; the running certificate stays.
	writeFile(t, keyPath, "not a key")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "failed to find any PEM data in key input") },
		10*time.Second, 10*time.Millisecond, "the refusal is logged: %s", logs.String())
	assert.Equal(t, "gw-b", served())

	roots.AddCert(selfSigned(t, "gw-c", certPath, keyPath))
	require.Eventually(t, func() bool { return served() == "gw-c" }, 10*time.Second, 10*time.Millisecond)

	// Turning TLS off takes a restart: the reload applies the rest and
	// says so.
	writeFile(t, cfgPath, gatewayYAML(a.addr()))
	hup <- os.Interrupt // any signal value: the watch only counts deliveries
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `"setting":"tls"`)
	}, 10*time.Second, 10*time.Millisecond, "%s", logs.String())
	assert.Equal(t, "gw-c", served())
}
