package batch

import "fmt"

// The wording of reasons and details, as the client and the log read
// them.

func joinReasons(a, b string) string { return joinNonEmpty("; ", a, b) }

// joinNonEmpty joins a and b with sep, leaving out either if empty.
func joinNonEmpty(sep, a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + sep + b
}

func wasWere(n int) string {
	if n == 1 {
		return "was"
	}
	return "were"
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
