// goheap.go: a Go program that keeps 3,000 slices and writes its heap profile in Go's
// debug=1 text form (the "heap profile: ... @ heap/N" header, '#' frame lines, and a
// "# runtime.MemStats" block) to the file named by its argument. For heapscope's reader of
// foreign heap files: totals must equal go tool pprof's on the same file.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

var keep [][]byte

//go:noinline
func leak(n int) { keep = append(keep, make([]byte, n)) } // LEAK:go

func main() {
	runtime.MemProfileRate = 64 * 1024
	for i := 0; i < 3000; i++ {
		leak(4096 + i%7*1000)
	}
	runtime.GC()
	f, _ := os.Create(os.Args[1])
	pprof.Lookup("heap").WriteTo(f, 1)
	f.Close()
	fmt.Println(len(keep))
}
