package tlsfiles

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority made on the spot (ECDSA P-256): `narwhal certs` writes one for a
// first deployment, tests make their own. Production certificates come from the operator's PKI
// (cert-manager, say); Narwhal only reads files.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Leaf describes a certificate to issue.
type Leaf struct {
	Name      string   // subject common name
	Groups    []string // subject organizations (Kubernetes reads a client certificate's as its groups)
	Hosts     []string // DNS names or IP addresses (subject alternative names)
	URIs      []string // URI SANs, such as spiffe://cluster.local/ns/llm/sa/envoy
	Server    bool     // usable by a TLS server
	Client    bool     // usable by a TLS client (mutual TLS)
	NotBefore time.Time
	NotAfter  time.Time // zero: a year after NotBefore
}

// NewCA makes a self-signed CA valid from now-1h for validity.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// PEM is the CA certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// Issue signs a certificate for l and returns it and its key, both PEM.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	if !l.Server && !l.Client {
		return nil, nil, errors.New("tlsfiles: a certificate for a server, a client or both")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	nb := l.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	na := l.NotAfter
	if na.IsZero() {
		na = nb.Add(365 * 24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: l.Name, Organization: l.Groups},
		NotBefore: nb, NotAfter: na, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	for _, u := range l.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, nil, fmt.Errorf("tlsfiles: URI %q: %w", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// WriteCA writes the CA certificate to dir/name.crt and returns the path.
func (ca *CA) WriteCA(dir, name string) (string, error) {
	p := filepath.Join(dir, name+".crt")
	return p, writeAtomic(p, ca.PEM(), 0o644)
}

// WriteLeaf issues l and writes dir/name.crt and dir/name.key (0600), each replaced atomically
// (a rename), and returns the two paths.
func (ca *CA) WriteLeaf(dir, name string, l Leaf) (certFile, keyFile string, err error) {
	c, k, err := ca.Issue(l)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeAtomic(keyFile, k, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writeAtomic(certFile, c, 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
