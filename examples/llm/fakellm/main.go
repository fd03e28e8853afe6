// Command fakellm serves the fake completion API of the LLM-gateway example
// (see package llm) on a loopback address.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/sluice-rl/sluice/examples/llm"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	log.Printf("fake completion API on http://%s/v1/chat/completions", *listen)
	log.Fatal(http.ListenAndServe(*listen, llm.Handler()))
}
