// Package loopback holds what the storage tests and the scenario both need to run servers
// on this machine's loopback interface.
package loopback

import "net"

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free when picked; another
// process may take one before a server binds it (callers retry on new ports).
func FreePorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
