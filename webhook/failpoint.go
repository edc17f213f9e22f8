//go:build failpoints

package webhook

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// In test builds (-tags failpoints, like store/bolt/failpoint.go),
// INFERD_WEBHOOK_HOSTS=name=address[,name=address...] makes webhook dials
// resolve those names to those addresses, as a DNS answer would: the
// policy's dial check then sees the address, so an end-to-end test can
// show that an allow-listed name resolving to a metadata address is
// refused. Production builds never read it.
func init() {
	v := os.Getenv("INFERD_WEBHOOK_HOSTS")
	if v == "" {
		return
	}
	testHosts = map[string]string{}
	for _, entry := range strings.Split(v, ",") {
		name, addr, ok := strings.Cut(entry, "=")
		if _, err := netip.ParseAddr(addr); !ok || err != nil {
			panic(fmt.Sprintf("INFERD_WEBHOOK_HOSTS entry %q: want name=address", entry))
		}
		testHosts[strings.ToLower(name)] = addr
	}
}
