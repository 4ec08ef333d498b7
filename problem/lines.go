package problem

import "go.yaml.in/yaml/v3"

// Lines maps the path of every key and list item of a YAML document (in the format of
// Key and Index) to its 1-based line. Aliases point at their anchor's lines; merge keys
// ("<<") contribute the keys the mapping does not set itself. A document that does not parse
// gives an empty index.
func Lines(data []byte) map[string]int {
	idx := map[string]int{}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return idx
	}
	idx[""] = doc.Content[0].Line
	yamlLines(doc.Content[0], "", idx, 0)
	return idx
}

func yamlLines(n *yaml.Node, path string, idx map[string]int, depth int) {
	if depth > 100 { // alias cycles
		return
	}
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		var merges []*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" && k.Tag == "!!merge" {
				merges = append(merges, v)
				continue
			}
			p := Key(path, k.Value)
			idx[p] = k.Line
			yamlLines(v, p, idx, depth+1)
		}
		for _, m := range merges {
			for m.Kind == yaml.AliasNode && m.Alias != nil {
				m = m.Alias
			}
			srcs := []*yaml.Node{m}
			if m.Kind == yaml.SequenceNode {
				srcs = m.Content
			}
			for _, src := range srcs {
				sub := map[string]int{}
				yamlLines(src, path, sub, depth+1)
				for p, l := range sub {
					if _, set := idx[p]; !set {
						idx[p] = l
					}
				}
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := Index(path, i)
			idx[p] = c.Line
			yamlLines(c, p, idx, depth+1)
		}
	}
}
