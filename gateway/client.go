package gateway

import (
	"context"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// maxRecvMsgSize bounds the replies the client accepts. Envoy's gRPC client
// does not cap replies below the buffer limits; this is generous.
const maxRecvMsgSize = 64 << 20

// Client plays Envoy's ext_proc filter with one configuration against one
// ext_proc server. It is safe for concurrent use; each HTTP request gets its
// own Exchange.
type Client struct {
	epc  extprocv3.ExternalProcessorClient
	mode Mode
	base *extprocfilterv3.ProcessingMode
}

// NewClient returns a client that opens its streams on cc (use Dial for an
// Envoy-like connection). It fails when mode is not a configuration Envoy
// accepts.
func NewClient(cc grpc.ClientConnInterface, mode Mode) (*Client, error) {
	if err := mode.Validate(); err != nil {
		return nil, err
	}
	return &Client{
		epc:  extprocv3.NewExternalProcessorClient(cc),
		mode: mode,
		base: mode.ProcessingMode(),
	}, nil
}

// Mode returns the configuration the client plays.
func (c *Client) Mode() Mode { return c.mode }

// NewExchange starts the processing of one HTTP request. ctx is the
// downstream request's context: cancelling it resets the ext_proc stream, as
// Envoy does when the client disconnects. The stream itself opens lazily
// with the first message. Call Close when the request ends.
func (c *Client) NewExchange(ctx context.Context) *Exchange {
	x := &Exchange{c: c, ctx: ctx}
	x.req.setMode(c.base, false)
	x.resp.setMode(c.base, true)
	return x
}

// Dial connects to an ext_proc server the way Envoy's ext_proc cluster does:
// HTTP/2 cleartext, one connection shared by every stream. opts are appended
// to the defaults.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	}
	return grpc.NewClient(addr, append(base, opts...)...)
}
