// A do-nothing admission webhook in Go (standard library only): it decodes the
// AdmissionReview, answers allowed for its uid, and changes nothing.
//
// bench/apiserver.py registers it in place of Envelope to price what *any*
// webhook call costs the API server on this machine, apart from Python, uvicorn
// and every rule. Not part of the product.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"log"
	"net/http"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request,omitempty"`
	Response *response `json:"response,omitempty"`
}

type response struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

func allow(w http.ResponseWriter, r *http.Request) {
	var in review
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 3<<20)).Decode(&in); err != nil || in.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out := review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview",
		Response: &response{UID: in.Request.UID, Allowed: true}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "listen address")
	cert := flag.String("cert-file", "", "serving certificate (PEM)")
	key := flag.String("key-file", "", "serving key (PEM)")
	http1 := flag.Bool("http1", false, "serve HTTP/1.1 only, as uvicorn does")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", allow)
	mux.HandleFunc("POST /validate", allow)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	server := &http.Server{Addr: *addr, Handler: mux, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	if *http1 {
		server.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	log.Fatal(server.ListenAndServeTLS(*cert, *key))
}
