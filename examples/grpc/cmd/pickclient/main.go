// Command pickclient is the client side of the picker service: it asks
// pickerd where to send a completion, optionally sends it there (an
// OpenAI-compatible /v1/completions call, streamed, timing the first byte),
// and reports the outcome with Done.
//
//	pickclient -server localhost:9002 -model m -prompt "Hello" -explain
//	pickclient -server localhost:9002 -model m -prompt "Hello" -send
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferroute/inferroute/examples/grpc/pickerpb"
)

func main() {
	server := flag.String("server", "localhost:9002", "pickerd address")
	model := flag.String("model", "", "model name")
	prompt := flag.String("prompt", "Hello", "prompt text")
	n := flag.Int("n", 1, "number of requests, one after another")
	send := flag.Bool("send", false, "send the completion to the chosen endpoint and time it")
	explain := flag.Bool("explain", false, "print the decision breakdown")
	flag.Parse()

	conn, err := grpc.NewClient(*server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := pickerpb.NewPickerClient(conn)
	for i := range *n {
		if err := once(client, fmt.Sprintf("req-%d", i), *model, *prompt, *send, *explain); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func once(client pickerpb.PickerClient, id, model, prompt string, send, explain bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.Pick(ctx, &pickerpb.PickRequest{
		RequestId:    id,
		Model:        model,
		Prompt:       prompt,
		PromptTokens: int32(len(prompt)/4 + 1), // ~4 bytes per token
		Explain:      explain,
	})
	if err != nil {
		return fmt.Errorf("pick: %w", err)
	}
	fmt.Printf("%s -> %s (%s), fallbacks %d, reservation %s\n", id, resp.GetEndpoint().GetName(),
		resp.GetEndpoint().GetAddress(), len(resp.GetFallbacks()), resp.GetReservationId())
	if explain {
		fmt.Print(resp.GetBreakdown().GetText())
	}
	done := &pickerpb.DoneRequest{ReservationId: resp.GetReservationId()}
	if send {
		firstToken := func() {
			// Tell the picker at once, not at Done: the request has left
			// the pod's prefill queue. Best effort: Done settles it anyway.
			fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
			defer fcancel()
			_, _ = client.FirstToken(fctx, &pickerpb.FirstTokenRequest{ReservationId: resp.GetReservationId()})
		}
		ttft, latency, connectErr, err := complete(resp.GetEndpoint().GetAddress(), model, prompt, firstToken)
		if err != nil {
			done.Error = err.Error()
			done.ConnectError = connectErr
		}
		if ttft > 0 {
			done.Ttft = durationpb.New(ttft)
		}
		if latency > 0 {
			done.Latency = durationpb.New(latency)
		}
		fmt.Printf("%s: ttft %v, latency %v, err %v\n", id, ttft, latency, err)
	}
	// Done is always sent, also after a failure: it releases the reservation.
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	if _, err := client.Done(dctx, done); err != nil {
		return fmt.Errorf("done: %w", err)
	}
	return nil
}

// complete streams an OpenAI completion from addr and returns the time to
// the first byte of the body and to its end, calling firstByte when that
// byte arrives. connectErr reports that the endpoint could not be reached
// at all.
func complete(addr, model, prompt string, firstByte func()) (ttft, latency time.Duration, connectErr bool, err error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 32, "stream": true})
	start := time.Now()
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		var oe *net.OpError
		return 0, 0, errors.As(err, &oe) && oe.Op == "dial", err
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.Peek(1); err == nil {
		ttft = time.Since(start)
		firstByte()
	}
	var sink bytes.Buffer
	_, err = sink.ReadFrom(r)
	latency = time.Since(start)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(sink.Bytes()))
	}
	return ttft, latency, false, err
}
